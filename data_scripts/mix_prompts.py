"""One prompt file from several sources, proportional at every prefix (dspark/data/prompts/mix.py):
answer it in order with regenerate.py (--grow / --stop-after for a long build in steps), and the
first N answered rows are the same mix at any N, the points of a data-size curve.

    python data_scripts/mix_prompts.py --output mix.jsonl \
        --source chat=runs/magpie/prompts.jsonl:3 --source math=gsm8k-train:2 \
        --source code=runs/magpie_code/prompts.jsonl:1:5000

`--source NAME=SPEC:WEIGHT[:LIMIT]`: SPEC is anything `regenerate.py --input` reads (a named
set, a file, a hub dataset); LIMIT its first rows. Rows keep their user turns and say where
they came from (`source`, `source_row`).

A Magpie set still being built (its summary.json beside it says `"complete": false`) is a
growing source: the mix stops where it runs out, and a later run, once it has grown, extends the
mix at its end. A long build samples prompts and answers the mix in alternating steps.
"""

import argparse
import json
from pathlib import Path

from dspark.data.build_status import mix_sources_path
from dspark.data.outputs import read_json_object
from dspark.data.prompts.mix import interleave
from dspark.data.prompts.sources import load_prompts
from dspark.errors import BadInputError, user_errors
from dspark.fileio import write_text_atomic
from dspark.locking import exclusive_output


def prompt_set_dir(spec: str) -> Path | None:
    """The folder of a target-written prompt set (a prompt file beside Magpie's summary.json)."""
    folder = Path(spec).parent
    return folder if Path(spec).is_file() and (folder / "summary.json").is_file() else None


def still_growing(spec: str) -> bool:
    """A prompt set whose summary.json says its build is unfinished (Magpie's)."""
    folder = prompt_set_dir(spec)
    return (
        folder is not None
        and (read_json_object(folder / "summary.json") or {}).get("complete") is False
    )


def parse_source(text: str) -> tuple[str, str, float, int | None]:
    name, sep, rest = text.partition("=")
    parts = rest.rsplit(":", 2) if rest.count(":") >= 2 and rest.rsplit(":", 2)[-1].isdigit() \
        else rest.rsplit(":", 1)  # fmt: skip
    try:
        weight = float(parts[1])
        limit = int(parts[2]) if len(parts) > 2 else None
    except (IndexError, ValueError):
        weight, limit = -1.0, None
    if not sep or not name or weight <= 0:
        raise BadInputError(f"--source {text!r}: expected NAME=SPEC:WEIGHT[:LIMIT], e.g. "
                            "math=gsm8k-train:2 (a positive weight)")  # fmt: skip
    return name, parts[0], weight, limit


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--source", action="append", required=True, help="NAME=SPEC:WEIGHT[:LIMIT]")
    ap.add_argument("--output", required=True, help="the mixed JSONL")
    a = ap.parse_args()
    with user_errors("mix_prompts"):
        specs = [parse_source(s) for s in a.source]
        sources, growing, listed = [], set(), []
        for name, spec, weight, limit in specs:
            rows = load_prompts(spec, limit=limit).rows
            turns = [{"turns": [m["content"] for m in r["messages"] if m["role"] == "user"],
                      "source": name, "source_row": r["index"]} for r in rows]  # fmt: skip
            sources.append((name, turns, weight))
            if still_growing(spec):
                growing.add(name)
            folder = prompt_set_dir(spec)
            listed.append({"name": name, "spec": spec, "weight": weight, "limit": limit,
                           "rows": len(turns), "growing": name in growing,
                           "prompt_set": str(folder.resolve()) if folder else None})  # fmt: skip
            print(f"{name}: {len(turns)} rows from {spec} (weight {weight:g})"
                  + (", still growing" if name in growing else ""))  # fmt: skip
        with exclusive_output(a.output, "the prompt mix"):
            mix = interleave(sources, growing)
            text = "".join(json.dumps({k: v for k, v in r.items() if not k.startswith("mix_")},
                                      ensure_ascii=False) + "\n" for r in mix)  # fmt: skip
            old = Path(a.output).read_text(encoding="utf-8") if Path(a.output).is_file() else ""
            if not text.startswith(old):  # rows a build answered by number would change
                raise BadInputError(
                    f"{a.output} holds another mix, and the rows a regeneration answered by "
                    "their number would change under it. A mix may only grow at its end (the "
                    "same sources and weights, sources longer); write a new --output instead"
                )
            write_text_atomic(a.output, text)
            # what build_status.py needs to project the mix to any length
            write_text_atomic(mix_sources_path(Path(a.output)), json.dumps(
                {"sources": listed, "rows": len(mix)}, indent=2) + "\n")  # fmt: skip
        cut = f" (stops where {', '.join(sorted(growing))} runs out: rerun when grown)"
        print(f"{len(mix)} rows -> {a.output}" + (cut if growing else ""))

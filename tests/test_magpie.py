"""Prompts the target writes itself (dspark/data/regeneration/magpie.py, prompt_filter.py): the pre-query
template of each template family, per-row seeding, kill-and-resume, filters and deduplication
worked by hand, the bench-overlap check on real bench prompts, and that the output is a prompt
source regeneration reads."""

from __future__ import annotations

import importlib.util
import json
from collections import Counter
from pathlib import Path

import pytest

from dspark.data.prompts.prompt_filter import (
    BenchOverlap,
    NearDuplicateIndex,
    jaccard,
    junk_reason,
    read_bench_texts,
    shingles,
)
from dspark.data.regeneration.magpie import (
    PROMPTS,
    REJECTED,
    SAMPLES,
    SUMMARY,
    Filters,
    PreQuery,
    generate_prompts,
    magpie_seed,
    pre_query_template,
    read_samples,
    select_prompts,
)
from dspark.data.regeneration.sampling import SamplingConfig
from dspark.errors import BadInputError

pytestmark = pytest.mark.usefixtures("one_thread")

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT.parent / "shared" / "data" / "bench"
SAMPLE = SamplingConfig(temperature=1.0, top_p=0.95, max_new_tokens=6, seed=3)
EXPECTED = {  # what each tiny family's template writes before a lone user message
    "llama": "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\n",
    "qwen2": "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n",
    "qwen3": "<|im_start|>user\n",
}
EOT = {"llama": "<|eot_id|>", "qwen2": "<|im_end|>", "qwen3": "<|im_end|>"}


def test_pre_query_template_of_each_tiny_family(tiny_target, arch):
    _, tok = tiny_target(arch)
    pre = pre_query_template(tok)
    assert pre.text == EXPECTED[arch]
    assert [tok.convert_ids_to_tokens(i) for i in pre.stop_ids] == [EOT[arch]]
    # The cut is where the template puts the message: prefix + message + the turn's end.
    full = tok.apply_chat_template([{"role": "user", "content": "Hi there"}], tokenize=False)
    assert full.startswith(pre.text + "Hi there" + EOT[arch])
    assert EOT[arch] in pre.markers


def test_pre_query_template_with_a_system_prompt(tiny_target):
    _, tok = tiny_target("qwen3")
    pre = pre_query_template(tok, system_prompt="Be brief.")
    assert pre.text == "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n"


def test_pre_query_template_of_smollm2():
    from dspark.target import TargetNotFoundError, load_tokenizer

    user_cache = Path.home() / ".cache" / "dspark"  # conftest points DSPARK_CACHE elsewhere
    try:
        tok = load_tokenizer("embedded", cache_dir=user_cache)
    except TargetNotFoundError as e:
        pytest.skip(f"embedded target not prepared: {e}")
    pre = pre_query_template(tok)
    assert pre.text.endswith("<|im_end|>\n<|im_start|>user\n")
    assert pre.text.startswith("<|im_start|>system\n")
    assert [tok.convert_ids_to_tokens(i) for i in pre.stop_ids] == ["<|im_end|>"]


@pytest.mark.parametrize(
    "template, words",
    [
        ("{{ messages[0]['content'] }}{{ messages[0]['content'] }}", "2 times"),
        ("{% for m in messages %}{{ m['content'] }}<|im_end|>{% endfor %}", "nothing before"),
        ("{% for m in messages %}User: {{ m['content'] }}\n{% endfor %}", "not a special token"),
        ("{{ raise_exception('no') }}", "refuses"),
        (None, "no chat template"),
    ],
)
def test_pre_query_template_refuses_what_it_cannot_derive(tiny_target, template, words):
    from transformers import AutoTokenizer

    _, tok = tiny_target("qwen3")
    tok = AutoTokenizer.from_pretrained(tok.name_or_path)  # a copy to change
    tok.chat_template = template
    with pytest.raises(BadInputError, match=words):
        pre_query_template(tok)


def backend_of(model, tok, batch_size=4):
    from dspark.data.regeneration.decoder_backend import DecoderBackend

    return DecoderBackend(model, tok, batch_size=batch_size)


def test_a_rows_text_depends_on_its_seed_only(tiny_target):
    from dspark.data.regeneration.magpie import sample_messages

    model, tok = tiny_target("qwen3")
    be, pre = backend_of(model, tok), pre_query_template(tok)
    a = sample_messages(be, tok, pre, [0, 1, 2, 3], 3, SAMPLE)
    b = sample_messages(be, tok, pre, [2, 5, 0], 3, SAMPLE)  # other neighbours, other order
    assert a[0]["text"] == b[2]["text"] and a[2]["text"] == b[0]["text"]
    assert a[0]["seed"] == magpie_seed(3, 0) != magpie_seed(4, 0)
    assert len({r["text"] for r in a}) == 4  # four seeds, four messages
    other = sample_messages(be, tok, pre, [0, 1, 2, 3], 4, SAMPLE)
    assert [r["text"] for r in other] != [r["text"] for r in a]


class Killed(Exception):
    pass


class KillAfter:
    """A backend that dies on its `calls + 1`-th chunk, like a run killed mid-way."""

    def __init__(self, backend, calls):
        self.be, self.calls = backend, calls

    def generate_ids(self, ids, seeds, sampling):
        if self.calls == 0:
            raise Killed
        self.calls -= 1
        return self.be.generate_ids(ids, seeds, sampling)


def test_kill_after_one_chunk_and_rerun_continues(tiny_target, tmp_path):
    model, tok = tiny_target("qwen3")
    kw = dict(num=10, target="tiny-qwen3", sampling=SAMPLE, chunk_rows=4, log=None)
    whole = tmp_path / "whole"
    generate_prompts(backend_of(model, tok), tok, whole, **kw)
    cut = tmp_path / "cut"
    with pytest.raises(Killed):
        generate_prompts(KillAfter(backend_of(model, tok), 1), tok, cut, **kw)
    assert sorted(read_samples(cut / SAMPLES)) == [0, 1, 2, 3]
    with open(cut / SAMPLES, "a") as f:
        f.write('{"index": 4, "te')  # the kill also cut a line of the next chunk in half
    summary = generate_prompts(backend_of(model, tok), tok, cut, **kw)
    lines = [json.loads(x) for x in (cut / SAMPLES).read_text().splitlines()]
    assert [r["index"] for r in lines] == list(range(10))  # none twice, none lost
    assert (cut / SAMPLES).read_text() == (whole / SAMPLES).read_text()
    assert (cut / PROMPTS).read_text() == (whole / PROMPTS).read_text()
    assert summary["generated"] == 10 and summary["generated_this_run"] == 6
    # A larger --num continues the same rows; other sampling settings are refused.
    more = generate_prompts(backend_of(model, tok), tok, cut, **{**kw, "num": 12})
    assert more["generated_this_run"] == 2
    hot = SamplingConfig(**{**SAMPLE.__dict__, "temperature": 0.7})
    with pytest.raises(BadInputError, match="temperature"):
        generate_prompts(backend_of(model, tok), tok, cut, **{**kw, "sampling": hot})


@pytest.mark.parametrize(
    "text, finished, reason",
    [
        ("   ", True, "empty"),
        ("What is the capital of France and why?", False, "unfinished"),
        ("Tell me a story<|im_start|>assistant", True, "template_token"),
        ("Tell me a story about \x07 a bell", True, "non_printable"),
        ("Tell me a story about \ufffd bytes", True, "non_printable"),
        ("Hi there", True, "too_short"),
        ("Why? " * 900, True, "too_long"),
        ("List three fruits.\nList three fruits.\nList three fruits.", True, "repetitive"),
        ("please help me " * 10, True, "repetitive"),
        ("Explain how a hash map handles collisions, with an example.", True, None),
    ],
)
def test_junk_filters(text, finished, reason):
    assert junk_reason(text, finished=finished, markers=["<|im_start|>", "<|im_end|>"]) == reason


def test_language_heuristic_is_optional():
    text = "Объясни, как работает хеш-таблица и что такое коллизия."
    assert junk_reason(text) is None
    assert junk_reason(text, language="en") == "not_english"


def test_shingles_and_jaccard_by_hand():
    a = shingles("one two three four five six")  # 2 five-grams
    b = shingles("One, two three four five SIX seven")  # 3, sharing both of a's
    assert a == {"one two three four five", "two three four five six"}
    assert jaccard(a, b) == pytest.approx(2 / 3)
    assert shingles("just three words") == {"just three words"}


def test_near_duplicate_index_finds_exactly_the_pairs_above_the_threshold():
    base = "please write a short poem about the sea at night with the moon above it".split()
    texts = [
        " ".join(base),
        " ".join(base[:-1] + ["them"]),  # last word changed: 10 of 12 five-grams shared
        " ".join(base[:7] + ["x", "y"] + base[9:]),  # a hole in the middle: well below 0.7
        "an unrelated question about sorting a list of integers in python quickly",
    ]
    sets = [shingles(t) for t in texts]
    index = NearDuplicateIndex(Counter(g for s in sets for g in s), 0.7)
    found = []
    for s in sets:
        found.append(index.find(s))
        index.add(s)
    assert found[0] is None
    assert found[1] is not None and found[1][0] == 0
    assert found[1][1] == pytest.approx(jaccard(sets[0], sets[1])) and found[1][1] >= 0.7
    assert jaccard(sets[0], sets[2]) < 0.7 and found[2] is None
    assert found[3] is None
    # exhaustive check: the index agrees with the exact measure on every pair
    for i, s in enumerate(sets):
        best = max((jaccard(s, sets[j]) for j in range(i)), default=0.0)
        assert (found[i] is not None) == (best >= 0.7)


def pre_for_tests() -> PreQuery:
    return PreQuery("<|im_start|>user\n", [2], ["<|im_start|>", "<|im_end|>"])


def sample(i, text, finished=True):
    return {"index": i, "seed": magpie_seed(0, i), "text": text, "finished": finished}


def test_select_prompts_keeps_the_first_of_each_duplicate_group():
    long = "How do I make a sourdough starter at home from scratch with only flour and water?"
    rows = [
        sample(3, long),
        sample(0, "Explain recursion to a ten year old, with one example."),
        sample(1, "explain RECURSION to a ten-year-old with one example"),  # exact after norm.
        sample(2, long.replace("water?", "water please?")),  # near; first by index, so kept
        sample(4, "Hi"),
    ]
    sel = select_prompts(rows, pre_for_tests(), Filters(), None, {"source": "magpie:t"})
    assert [r["index"] for r in sel.kept] == [0, 2]
    assert sel.kept[0]["turns"] == [rows[1]["text"]] and sel.kept[0]["source"] == "magpie:t"
    why = {r["index"]: r for r in sel.rejected}
    assert why[1]["reason"] == "duplicate_exact" and why[1]["of"] == 0
    assert why[3]["reason"] == "duplicate_near" and why[3]["of"] == 2 and why[3]["jaccard"] >= 0.7
    assert why[4]["reason"] == "too_short"
    assert sel.counts == Counter(duplicate_exact=1, duplicate_near=1, too_short=1)


def bench_rows():
    if not BENCH.is_dir():
        pytest.skip(f"no bench sets at {BENCH} (the shared data folder is absent)")
    return read_bench_texts(BENCH)


def test_bench_overlap_on_real_bench_prompts():
    texts = bench_rows()
    bench = BenchOverlap(texts)
    by_set = {}
    for name, t in texts:
        by_set.setdefault(name, t)
    assert {"gsm8k", "mt-bench"} <= set(by_set)
    mt = by_set["mt-bench"]
    assert bench.match(mt)[:2] == ("mt-bench", "exact")
    assert bench.match("  " + mt.upper() + "!! ")[1] == "exact"  # case, spacing, punctuation
    words = mt.split()
    edited = " ".join(words[:-1] + ["please"])  # one word changed at the end
    hit = bench.match(edited)
    assert hit is not None and hit[0] == "mt-bench" and hit[1] != "exact" and hit[2] >= 0.7
    # a GSM8K question without the set's "reason step by step" suffix is still that question
    gsm = by_set["gsm8k"]
    assert "\n" in gsm
    question = gsm.split("\n")[0]
    hit = bench.match(question)
    assert hit is not None and hit[0] == "gsm8k"
    assert bench.match("Write a haiku about my cat sleeping on a warm laptop keyboard.") is None
    sel = select_prompts(
        [sample(0, mt), sample(1, edited), sample(2, "Suggest five names for a bakery in Lyon.")],
        pre_for_tests(),
        Filters(),
        bench,
        {},
    )
    assert [r["index"] for r in sel.kept] == [2]
    assert sel.counts == Counter(bench_exact=1, bench_near=1)


def test_bench_overlap_on_hand_made_near_duplicates(tmp_path):
    prompt = "Describe the water cycle in four short steps for a primary school science class."
    (tmp_path / "mine.jsonl").write_text(json.dumps({"turns": [prompt, "Now in French."]}) + "\n")
    bench = BenchOverlap(read_bench_texts(tmp_path))
    assert len(bench) == 2
    near = prompt.replace("class.", "class, please.")
    assert bench.match(near)[0] == "mine"
    inside = "Hello! " + prompt + " Thanks a lot in advance for all your help with this."
    assert bench.match(inside)[1] == "containment"
    assert bench.match("Describe the water cycle to me.") is None
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(BadInputError, match="no \\*.jsonl"):
        read_bench_texts(empty)


class ScriptedBackend:
    """Answers row i (found by its seed) with `texts[i]` and the end-of-turn id, so the whole
    pipeline runs on known messages; `None` leaves a row unfinished (no end-of-turn)."""

    def __init__(self, tok, texts, stop_id, seed):
        self.tok, self.stop = tok, stop_id
        self.by_seed = {magpie_seed(seed, i): t for i, t in enumerate(texts)}

    def generate_ids(self, ids, seeds, sampling):
        out = []
        for s in seeds:
            text = self.by_seed[s]
            body = self.tok(text or "and then it just goes on", add_special_tokens=False)
            out.append(body["input_ids"] + ([self.stop] if text is not None else []))
        return out


def test_output_is_a_prompt_source_regeneration_reads(tiny_target, tmp_path):
    from dspark.data.prompts.sources import load_prompts

    _, tok = tiny_target("qwen3")
    pre = pre_query_template(tok)
    bench_dir = tmp_path / "bench"
    bench_dir.mkdir()
    copied = "Summarise the plot of a famous novel in exactly three sentences for a student."
    (bench_dir / "set.jsonl").write_text(json.dumps({"turns": [copied]}) + "\n")
    texts = [
        "What are three good habits for writing readable code?",
        "what are three good habits for writing readable code",
        copied,
        None,
        "Plan a two day trip to Kyoto for someone who loves gardens and tea.",
        "Tell me <|im_start|>assistant a joke.",
    ]
    be = ScriptedBackend(tok, texts, pre.stop_ids[0], seed=3)
    out = tmp_path / "out"
    summary = generate_prompts(
        be,
        tok,
        out,
        num=len(texts),
        target="tiny-qwen3",
        sampling=SAMPLE,
        chunk_rows=4,
        bench=BenchOverlap(read_bench_texts(bench_dir)),
        bench_dir=str(bench_dir),
        log=None,
    )
    assert summary["generated"] == 6 and summary["kept"] == 2
    assert summary["rejected"] == {
        "bench_exact": 1,
        "duplicate_exact": 1,
        "template_token": 1,
        "unfinished": 1,
    }
    assert summary["duplicates"] == {"exact": 1, "near": 0}
    assert summary["bench_overlap"] == {"exact": 1, "near": 0}
    assert json.loads((out / SUMMARY).read_text()) == summary
    assert len((out / REJECTED).read_text().splitlines()) == 4
    rows = [json.loads(x) for x in (out / PROMPTS).read_text().splitlines()]
    assert rows[0]["source"] == "magpie:tiny-qwen3" and rows[0]["seed"] == magpie_seed(3, 0)
    assert rows[0]["sampling"]["temperature"] == 1.0 and rows[0]["run_seed"] == 3
    ps = load_prompts(str(out / PROMPTS))
    assert not ps.rejected
    assert [r["messages"] for r in ps.rows] == [
        [{"role": "user", "content": texts[0]}],
        [{"role": "user", "content": texts[4]}],
    ]
    assert [r["source_index"] for r in ps.rows] == [0, 4]


def magpie_script():
    spec = importlib.util.spec_from_file_location(
        "magpie_prompts", ROOT / "data_scripts" / "magpie_prompts.py"
    )
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.main


def error_line(capsys, argv) -> str:
    capsys.readouterr()
    with pytest.raises(SystemExit) as e:
        magpie_script()(argv)
    assert e.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("magpie_prompts: error: "), lines
    return lines[0]


def test_script_runs_and_refuses_bad_input(tiny_target_dir, tmp_path, capsys):
    tiny_target_dir("qwen3")
    bench = tmp_path / "bench"
    bench.mkdir()
    (bench / "b.jsonl").write_text(json.dumps({"turns": ["Name the planets in order."]}) + "\n")
    out = tmp_path / "out"
    base = ["--target", "tiny-qwen3", "--output", str(out), "--bench-dir", str(bench)]
    fast = ["--max-new-tokens", "4", "--batch-size", "2", "--quiet", "--device", "cpu"]
    assert magpie_script()([*base, "--num", "3", *fast]) == 0
    summary = json.loads((out / SUMMARY).read_text())
    assert summary["generated"] == 3 and summary["bench_prompts"] == 1
    assert summary["kept"] + sum(summary["rejected"].values()) == 3
    assert "--num 0" in error_line(capsys, [*base, "--num", "0"])
    assert "temperature" in error_line(capsys, [*base, "--num", "3", "--temperature", "0"])
    line = error_line(capsys, [*base, "--num", "3", *fast, "--top-p", "0.5"])
    assert "other settings" in line and "top_p" in line  # refused before the model loads
    missing = ["--bench-dir", str(tmp_path / "nope")]
    assert "no such directory" in error_line(capsys, [*base, "--num", "3", *missing])
    (tmp_path / "file").write_text("x")
    assert "is a file" in error_line(
        capsys, ["--target", "tiny-qwen3", "--num", "1", "--output", str(tmp_path / "file")]
    )


def test_stop_after_is_a_bounded_step_and_a_rerun_continues(tiny_target, tmp_path):
    model, tok = tiny_target("qwen3")
    kw = dict(num=10, target="tiny-qwen3", sampling=SAMPLE, chunk_rows=4, log=None)
    whole = tmp_path / "whole"
    assert generate_prompts(backend_of(model, tok), tok, whole, **kw)["complete"] is True
    step = tmp_path / "step"
    first = generate_prompts(backend_of(model, tok), tok, step, stop_after_s=0.0, **kw)
    assert first["complete"] is False and first["generated"] == 4  # one chunk, then it stops
    while not (s := generate_prompts(backend_of(model, tok), tok, step, stop_after_s=0.0, **kw))[
        "complete"
    ]:
        pass
    assert s["generated"] == 10
    assert (step / SAMPLES).read_text() == (whole / SAMPLES).read_text()


def test_each_run_is_a_line_and_each_new_sample_names_its_generator(tiny_target, tmp_path):
    model, tok = tiny_target("qwen3")
    kw = dict(target="tiny-qwen3", sampling=SAMPLE, chunk_rows=4, log=None)
    out = tmp_path / "m"
    generate_prompts(backend_of(model, tok), tok, out, num=4, **kw)  # an older run: no name
    generate_prompts(backend_of(model, tok), tok, out, num=8, generator="llama-cpp:t.gguf",
                     conditions={"engine": "fake", "threads": 3}, **kw)  # fmt: skip
    samples = [json.loads(x) for x in (out / SAMPLES).read_text().splitlines()]
    assert [s.get("generator") for s in samples] == [None] * 4 + ["llama-cpp:t.gguf"] * 4
    runs = [json.loads(x) for x in (out / "runs.jsonl").read_text().splitlines()]
    assert [r["generated_this_run"] for r in runs] == [4, 4]
    assert runs[1]["generator"] == "llama-cpp:t.gguf" and runs[1]["engine"] == "fake"
    assert runs[1]["generated"] == 8 and runs[1]["complete"] is True
    assert all(r["cpu_s"] > 0 and r["generated_tokens_this_run"] > 0 for r in runs)  # its cost

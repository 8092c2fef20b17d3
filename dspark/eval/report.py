"""`report.md` from `results.json`: every table opens with the conditions it was measured under.

Parallels `dspark/training/report.py` (a run's) and `dspark/calibration/report.py` (an STS
fit's).
"""

from __future__ import annotations

from dspark.dtype_choice import break_even_tau
from dspark.eval import auto_settings, fastest_plain


def _f(x, digits: int = 2) -> str:
    if x is None:
        return "n/a"
    if isinstance(x, bool):
        return "yes" if x else "no"
    if isinstance(x, int):
        return str(x)
    return f"{x:.{digits}f}"


def _pct(x) -> str:
    return "n/a" if x is None else f"{100 * x:.1f}%"


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return lines


def _sampling(c: dict) -> str:
    if c["temperature"] == 0:
        return "greedy (T=0)"
    return f"T={c['temperature']}, top_p={c['top_p']}, top_k={c['top_k']}"


def _where(c: dict) -> str:
    return (
        f"{c['device']} ({c['device_name']}), {c['dtype']}, {c['cpu_threads']} CPU threads, "
        f"torch {c['torch']}, transformers {c['transformers']}"
    )


def _monitoring(ds: dict, base_cond: str, where: str) -> list[str]:
    """Draft vs verify time per round, and the break-even tau those times imply."""
    out: list[str] = []
    mon = [(name, d["monitoring"]) for name, d in ds.items() if d.get("monitoring")]
    if mon:
        out += [
            "",
            "## Draft vs verify time per round (monitoring)",
            "",
            f"Conditions: {base_cond}; {where}. Per round of a batch: draft = block pass + "
            "Markov loop + verify-length policy; verify = target pass + acceptance + draft "
            "context write + the host copy (AR: one decode step). draft/verify above ~0.3 "
            "means the draft, not the target, limits the speedup. Verify tokens = tokens the "
            "policy priced (sum of 1 + L per request); padded = what the padded pass computed.",
            "",
        ]
        rows = []
        for name, m in mon:
            for method in ("speculative", "autoregressive"):
                if method not in m:
                    continue
                x = m[method]
                rows.append(
                    [
                        name,
                        method,
                        str(x["rounds"]),
                        _f(x["draft_ms_per_round"], 1),
                        _f(x["verify_ms_per_round"], 1),
                        _f(x["draft_over_verify"]),
                        _f(x["verify_tokens_per_round"], 1),
                        _f(x["padded_tokens_per_round"], 1),
                    ]
                )
        out += _table(
            [
                "dataset",
                "decoder",
                "rounds",
                "draft ms",
                "verify ms",
                "draft/verify",
                "verify tok/round",
                "padded tok/round",
            ],
            rows,
        )

    out += _break_even(ds, mon)
    return out


def _break_even(ds: dict, mon: list) -> list[str]:
    """tau a draft needs here: (draft + verify ms per round) / (ms per plain AR step)."""
    lines = []
    for name, m in mon:
        spec, ar = m.get("speculative"), m.get("autoregressive")
        if not spec or not ar or not ar.get("verify_ms_per_round"):
            continue
        be = break_even_tau(
            ar["verify_ms_per_round"], spec["draft_ms_per_round"], spec["verify_ms_per_round"]
        )
        tau = ds[name]["acceptance"]["tau"]
        verdict = "pays off" if tau > be else "does not pay off"
        lines.append(
            f"- {name}: a round costs {_f(be)} plain AR steps, so break-even tau = {_f(be)}; "
            f"this draft's tau {_f(tau)} {verdict} here"
        )
    if not lines:
        return []
    return [
        "",
        "**Where speculation pays off on this device** (from the times above: a round must "
        "commit more tokens than the AR steps it costs; tau above break-even = faster than "
        "plain decoding):",
        "",
        *lines,
    ]


def render_report(results: dict, plots: dict[str, str] | None = None) -> str:
    c = results["conditions"]
    ds = results["datasets"]
    policy = c.get("verify_policy") or (
        "full" if c["confidence_threshold"] is None else "threshold"
    )
    verify = {
        "full": "full block",
        "threshold": f"confidence threshold {c['confidence_threshold']}",
        "scheduler": f"prefix scheduler ({c.get('scheduler_batch', 'padded')} pricing)",
    }[policy]
    length = c.get("verify_length")
    if policy == "full" and isinstance(length, int) and length < c["block_size"]:
        verify = f"the first {length} of the block's {c['block_size']} drafts (verify_length)"
    if c.get("confidence_temperatures"):
        verify += ", STS-calibrated confidences"

    base_cond = (
        f"target `{c['target']}`, draft `{c['draft']}`, block size {c['block_size']}, "
        f"{_sampling(c)}, batch {c['batch_size']}, max_new_tokens "
        f"{c['max_new_tokens']}, verification: {verify}, turns: {c['turns']}, "
        f"seed {c['seed']}"
    )
    out = ["# DSpark benchmark", ""]
    out += ["## Conditions", ""]
    out += _table(["key", "value"], [[k, f"`{v}`"] for k, v in c.items() if k != "draft_config"])
    out += [
        "",
        "Draft config: " + ", ".join(f"{k}=`{v}`" for k, v in c["draft_config"].items()),
        "",
    ]

    out += [
        "## Acceptance",
        "",
        f"Conditions: {base_cond}. tau counts the bonus/correction token; "
        "drafted = rounds x block size, verified = drafts sent to the target (without a "
        "confidence threshold a verify rate under 100% comes from the max_new_tokens budget "
        "capping the last rounds).",
        "",
    ]
    rows = []
    for name, d in ds.items():
        a = d["acceptance"]
        rows.append(
            [
                name,
                str(d["requests"]),
                _f(d["prompt_tokens_mean"], 0),
                _f(a["tau"]),
                _f(a["tau_no_bonus"]),
                _pct(a["verify_rate"]),
                str(a["rounds"]),
                str(a["drafted"]),
                str(a["verified"]),
                str(a["accepted"]),
            ]
        )
    out += _table(
        [
            "dataset",
            "requests",
            "prompt tok",
            "tau",
            "tau w/o bonus",
            "verify rate",
            "rounds",
            "drafted",
            "verified",
            "accepted",
        ],
        rows,
    )
    if results["overall"]["tau_macro"] is not None:
        out += [
            "",
            f"Macro-average tau over {len(ds)} datasets: {_f(results['overall']['tau_macro'])}.",
        ]

    gamma = c["block_size"]
    for key, title in (
        ("conditional_acceptance", "Conditional acceptance P(accept k | k-1 accepted)"),
        ("survival", "Survival P(drafts 1..k all accepted)"),
    ):
        out += ["", f"## {title}", "", f"Conditions: {base_cond}.", ""]
        rows = [[name] + [_pct(x) for x in d["acceptance"][key]] for name, d in ds.items()]
        out += _table(["dataset"] + [f"k={k}" for k in range(1, gamma + 1)], rows)

    out += [
        "",
        "## Speed: dspark speculative vs dspark autoregressive",
        "",
        f"Conditions: {base_cond}; {_where(c)}; same prompts and max_new_tokens in one run, "
        f"{c['warmup_calls']} untimed warm-up call(s) per decoder, calls interleaved per "
        "batch. Speedup = speculative tokens/s / autoregressive tokens/s; efficiency = "
        "speedup / tau (1.0 = a round costs one AR step).",
        "",
    ]
    rows = []
    for name, d in ds.items():
        s = d["speed"]
        rows.append(
            [
                name,
                _f(s["autoregressive"]["tokens_per_s"], 1),
                _f(s["speculative"]["tokens_per_s"], 1),
                _f(s["speedup"]) + "x",
                _f(d["acceptance"]["tau"]),
                _f(s["decoder_efficiency"]),
                _pct(s["greedy_match"]),
            ]
        )
    o = results["overall"]
    rows.append(
        [
            "**all**",
            _f(o["autoregressive"]["tokens_per_s"], 1),
            _f(o["speculative"]["tokens_per_s"], 1),
            _f(o["speedup"]) + "x",
            _f(o["tau_macro"]) + " (macro)",
            "",
            "",
        ]
    )
    out += _table(
        ["dataset", "AR tok/s", "spec tok/s", "speedup", "tau", "efficiency", "output == AR (T=0)"],
        rows,
    )

    out += [""] + fastest_plain.report_lines(results)  # the speedup vs the fastest plain dtype
    out += auto_settings.report_lines(results.get("auto_settings"))  # what the probe chose
    out += _monitoring(ds, base_cond, _where(c))

    if c["baselines"]:
        assistant = (
            f"truncated self-draft = first {c['assistant_layers']} of "
            f"{c['target_layers']} target layers + final norm + lm_head"
        )
        note = (
            ""
            if c["temperature"] == 0
            else f" NOTE: dspark ran at {_sampling(c)} while transformers ran greedy."
        )
        out += [
            "",
            "## Versus transformers' own decoders",
            "",
            f"Conditions: target `{c['target']}`, {c['baseline_decoding']}, max_new_tokens "
            f"{c['max_new_tokens']}, same prompts; hf_assisted: `generate(assistant_model=...)`"
            f" with a {assistant}, num_assistant_tokens "
            f"{c['num_assistant_tokens'] or 'transformers default'}; hf_prompt_lookup: "
            f"`prompt_lookup_num_tokens={c['prompt_lookup_num_tokens']}`, max ngram "
            f"{c['prompt_lookup_max_ngram']}; {_where(c)}. Speedups are vs `hf_generate` "
            f"(plain `generate`); the last columns are dspark speculative tokens/s divided by "
            f"each baseline's (dspark at batch {c['batch_size']}).{note}",
            "",
        ]
        names = c["baselines"]
        rows = []
        for name, d in ds.items():
            b = d["baselines"]
            row = [name]
            for n in names:
                sp = b[n]["speedup_vs_hf_generate"]
                row.append(_f(b[n]["tokens_per_s"], 1) + (f" ({_f(sp)}x)" if sp else ""))
            row.append(_f(d["speed"]["speculative"]["tokens_per_s"], 1))
            row += [_f(d["speculative_vs_baselines"][n]) + "x" for n in names]
            rows.append(row)
        out += _table(
            ["dataset"]
            + [f"{n} tok/s" for n in names]
            + ["dspark tok/s"]
            + [f"dspark / {n}" for n in names],
            rows,
        )

    calib = results.get("calibration")
    if calib:
        out += [
            "",
            "## Confidence calibration",
            "",
            f"Conditions: {base_cond}; {c['calibration_bins']} equal-width bins. "
            "conditional: c_k vs draft k accepted, on rounds where drafts before k were "
            "accepted and k was verified; survival: prod_{i<=k} c_i vs drafts 1..k all "
            "accepted, on rounds where k was verified.",
            "",
        ]
        rows = []
        for name, d in list(ds.items()) + [("**all**", {"calibration": calib})]:
            cd = d.get("calibration") or {}
            for view in ("conditional", "survival"):
                if view in cd:
                    v = cd[view]
                    rows.append(
                        [
                            name,
                            view,
                            str(v["n"]),
                            _pct(v["positive_rate"]),
                            _pct(v["mean_confidence"]),
                            _pct(v["ece"]),
                            _f(v["auroc"], 3),
                            _f(v["brier"], 3),
                        ]
                    )
        out += _table(
            ["dataset", "view", "n", "accepted", "mean conf", "ECE", "AUROC", "Brier"], rows
        )
        by_pos = calib.get("conditional_by_position") or []
        if by_pos:
            out += [
                "",
                "Per position, all datasets pooled (conditional view; survival in parentheses):",
                "",
            ]
            surv = {r["position"]: r for r in calib.get("survival_by_position") or []}
            rows = []
            for r in by_pos:
                s = surv.get(r["position"], {})
                rows.append(
                    [
                        str(r["position"]),
                        str(r["n"]),
                        _pct(r["positive_rate"]),
                        f"{_pct(r['ece'])} ({_pct(s.get('ece'))})",
                        f"{_f(r['auroc'], 3)} ({_f(s.get('auroc'), 3)})",
                    ]
                )
            out += _table(["k", "n", "accepted", "ECE", "AUROC"], rows)
        sts = results.get("sts")
        if sts:
            out += [
                "",
                "Sequential Temperature Scaling (survival view, all datasets pooled): "
                f"fit on {sts['fit_requests']} requests, scored on {sts['test_requests']} "
                f"(n={sts['n_test']}): ECE {_pct(sts['ece_before'])} -> "
                f"{_pct(sts['ece_after'])}, Brier {_f(sts['brier_before'], 3)} -> "
                f"{_f(sts['brier_after'], 3)}; temperatures T_k = "
                + ", ".join(_f(t) for t in sts["temperatures"])
                + ".",
            ]
    elif results.get("calibration") is None and "calibration" in results:
        out += ["", "## Confidence calibration", "", "No confidences were recorded."]
    if plots:
        out += ["", "## Plots", ""]
        out += [f"![{k}]({v})" for k, v in plots.items()]
    return "\n".join(out) + "\n"

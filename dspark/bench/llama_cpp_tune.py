"""Tuning llama.cpp's `draft-dspark` flags on held-out prompts: the modes measured (every
n_max x p_min, or the cost model's four probes), the round cost fitted to them, and the
acceptance the bundled decoder's rounds predict, moved to what llama.cpp accepted on the
probes (`llama_cpp_flags`)."""

from __future__ import annotations

from dspark.bench import llama_cpp_flags as flags
from dspark.bench.llama_cpp import Mode, pooled, run_modes
from dspark.bench.llama_cpp_curve import server_curve

P_MIN_GRID = (0.0, 0.5)  # confidence cut-offs tried per n_max (0: off)


def tune_modes(block_size: int, has_confidence: bool, how: str) -> list[Mode]:
    """The draft modes tuning measures: `grid` every n_max 1..block-1 x `P_MIN_GRID`; `model`
    the four a cost fit needs (n_max 1, half and whole blocks, and a p_min cut that drafts less
    at the whole block's n_max), the choice then coming from `llama_cpp_flags`."""
    longest = max(1, block_size - 1)
    if how == "model":
        cut = 0.5 if has_confidence else 0.0
        probe = {(1, 0.0), (longest, 0.0), (longest, cut), (max(1, longest // 2), 0.0)}
        return [Mode("draft-dspark", n, p) for n, p in sorted(probe)]
    p_grid = P_MIN_GRID if has_confidence else (0.0,)
    return [Mode("draft-dspark", n, p) for n in range(1, block_size) for p in p_grid]


def tune(settings, block_size: int, has_confidence: bool, prompts, max_new_tokens, progress,
         how: str = "grid", rounds=None):  # fmt: skip
    """Measure `tune_modes` on `prompts` (pooled over their sets); the fastest measured mode, or
    with `rounds` (`decoder_rounds`) under `how="model"` the cost model's choice; and the grid
    with each mode's figures (and, with `rounds`, its predicted ones under the acceptance shift
    fitted to the measured modes)."""
    modes = [Mode("none"), *tune_modes(block_size, has_confidence, how)]
    runs = run_modes(settings, modes, prompts, max_new_tokens, progress=progress)
    plain = pooled(runs, modes[0])  # every tuning prompt of every set, as one run
    grid: list[dict] = []
    for mode in modes[1:]:
        run = pooled(runs, mode)
        r = run.summary(plain)
        grid.append({"n_max": mode.n_max, "p_min": mode.p_min, "tokens_per_s": r["tokens_per_s"],
                     "tau": r["tau"], "round_ms": r["round_ms"],
                     "break_even_tau": r.get("break_even_tau"), "rounds": run.rounds,
                     "drafted": run.drafted, "decode_ms": 1e3 * run.seconds})  # fmt: skip
    best = max(grid, key=lambda g: g["tokens_per_s"] or 0.0)
    out = {"grid": grid, "how": how, "plain_tokens_per_s": plain.tokens / plain.seconds}
    chosen = Mode("draft-dspark", int(best["n_max"]), float(best["p_min"]))
    if rounds is not None:
        curve = server_curve(settings, block_size, progress)
        out["verify_curve_ms"] = curve
        cost = flags.fit_round_cost(grid, 1e3 * plain.seconds / plain.tokens, curve)
        conf = rounds["conf"]
        shift = flags.fit_acceptance_shift(conf, rounds["survival"], grid)
        surv = flags.shift_survival(rounds["survival"], shift)
        out["acceptance_shift"] = {
            "logits": float(shift),
            "tau_bundled": flags.modes_tau(grid, conf, rounds["survival"]),
            "tau_llama_cpp": flags.modes_tau(grid),
        }
        for g in grid:
            g["predicted"] = flags.predict(cost, conf, surv, g["n_max"], g["p_min"])
        pick, table = flags.choose_flags(cost, conf, surv, max(1, block_size - 1))
        out["cost"] = cost.as_dict()
        out["model_choice"] = pick
        out["model_table"] = table
        out["rounds"] = {k: v for k, v in rounds.items() if k not in ("conf", "survival")}
        if how == "model":
            chosen = Mode("draft-dspark", pick["n_max"], pick["p_min"])
    return chosen, out

"""``ovpool bench`` output: a plain-text table, and a PNG plot of the concurrency sweep."""

from __future__ import annotations

from pathlib import Path


def _num(value, fmt: str = ".1f") -> str:
    return "-" if value is None else format(value, fmt)


def sweep_table(results: dict) -> list[str]:
    rows = results.get("sweep") or []
    if not rows:
        return []
    ratios = results.get("ratios") or {}
    lines = [f"{'N':>3} {'ovpool tok/s':>13} {'GenAI CB tok/s':>15} {'ratio':>6} {'x single':>9} "
             f"{'p50 lat s':>10} {'p99 lat s':>10} {'p99 TTFT s':>11}  lost/dup"]
    for r in rows:
        ours, theirs = r["ovpool"], r.get("genai_cb") or {}
        ratio = ratios.get(str(r["concurrency"]), {})
        lines.append(f"{r['concurrency']:>3} {_num(ours['tokens_per_s']):>13} "
                     f"{_num(theirs.get('tokens_per_s')):>15} {_num(ratio.get('vs_genai_cb'), '.2f'):>6} "
                     f"{_num(ratio.get('vs_single'), '.2f'):>9} {_num(ours['latency_p50_s'], '.2f'):>10} "
                     f"{_num(ours['latency_p99_s'], '.2f'):>10} {_num(ours['ttft_p99_s'], '.2f'):>11}  "
                     f"{len(ours['problems']) or 'none'}")
    return lines


def single_lines(results: dict) -> list[str]:
    single = results.get("single") or {}
    lines = []
    for who in ("ovpool", "genai"):
        if who in single:
            s = single[who]
            lines.append(f"single stream {who:<7} TTFT {_num(s['ttft_s'], '.3f')} s, decode "
                         f"{_num(s['decode_tokens_per_s'])} tok/s")
    return lines


def other_lines(results: dict) -> list[str]:
    lines = []
    if "agreement" in results:
        a = results["agreement"]
        for key, alone in (("vs_alone_batching_path", "alone on the batching path"),
                           ("vs_engine", "alone on the engine's graph")):
            m = a[key]
            lines.append(f"greedy batched vs {alone} ({a['precision']}, KV {a['kv_cache_precision']}): "
                         f"{m['identical']}/{a['requests']} identical, mean common prefix "
                         f"{m['mean_common_prefix']:.0%}")
    for key, title in (("startup", "start-up"), ("overhead", "broker overhead")):
        if key in results:
            lines.append(f"{title}: {_brief(results[key])}")
    return lines


def chat_lines(results: dict) -> list[str]:
    chat = results.get("chat")
    if not chat:
        return []
    w = chat["workload"]
    lines = [f"chat: {w['conversations']} conversations x {w['turns']} turns, a {w['system_prompt_chars']:,}"
             f"-character system prompt, {w['max_tokens']} new tokens a turn (fastest of {w['repeats']})"]
    runs = [("one worker, prefix cache on", chat["one_worker"].get("prefix_on")),
            ("one worker, prefix cache off", chat["one_worker"].get("prefix_off")),
            ("GenAI CB, prefix caching", chat.get("genai_prefix")),
            ("two workers, prefix routing", chat["two_workers"].get("prefix")),
            ("two workers, least-loaded", chat["two_workers"].get("least_loaded")),
            ("two workers, prefix, docs+pauses", chat["two_workers"].get("prefix_documents")),
            ("two workers, least, docs+pauses", chat["two_workers"].get("least_loaded_documents"))]
    for title, r in runs:
        if r is not None:
            share = r.get("cached_share")
            lines.append(f"  {title:<30} TTFT turns 2+ {_num(r['ttft_later_turns_median_s'], '.3f')} s, "
                         f"{_num(r['tokens_per_s'])} tok/s"
                         + ("" if share is None else f", {share:.0%} of prompt tokens cached")
                         + (f", {len(r['errors'])} failed turns" if r["errors"] else ""))
    lines.append("  ratios: " + ", ".join(f"{k} {_num(v, '.2f')}" for k, v in chat["ratios"].items()))
    return lines


def _brief(block: dict) -> str:
    if "skipped" in block or "failed" in block:
        return block.get("skipped") or block["failed"]
    if "median" in block:  # cache_startup.py
        return ", ".join(f"{name} {m['start_to_first_token_s']:.2f} s to first token"
                         for name, m in block["median"].items())
    return ", ".join(f"{k} {v}" for k, v in block.items())


def text(results: dict) -> str:
    head = (f"model {results['model']} on {results['device']}, {results['max_tokens']} new tokens per "
            f"request, OpenVINO {results['openvino']}")
    if results.get("cpu"):
        head += f"\ncpu: {results['cpu']}"
    return "\n".join([head, *single_lines(results), *sweep_table(results), *chat_lines(results),
                      *other_lines(results)])


def plot(results: dict, path: str | Path) -> Path:
    """Aggregate tokens/s and p99 latency against concurrency, ovpool vs GenAI CB."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    rows = results["sweep"]
    n = [r["concurrency"] for r in rows]
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    left.plot(n, [r["ovpool"]["tokens_per_s"] for r in rows], "o-", label="ovpool (broker + worker)")
    if all("genai_cb" in r for r in rows):
        left.plot(n, [r["genai_cb"]["tokens_per_s"] for r in rows], "s--", label="GenAI ContinuousBatching")
    left.set(xlabel="concurrent requests", ylabel="aggregate tokens/s", xscale="log", xticks=n)
    left.set_xticklabels([str(x) for x in n])
    left.legend()
    right.plot(n, [r["ovpool"]["latency_p99_s"] for r in rows], "o-", label="p99 latency")
    right.plot(n, [r["ovpool"]["ttft_p99_s"] for r in rows], "^-", label="p99 time to first token")
    right.set(xlabel="concurrent requests", ylabel="seconds", xscale="log", xticks=n)
    right.set_xticklabels([str(x) for x in n])
    right.legend()
    for ax in (left, right):
        # A log axis labels its minor ticks too ("2×10⁰"); only the measured levels are wanted.
        ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    where = results.get("cpu") or results["device"]
    fig.suptitle(f"{results['model']}, {results['max_tokens']} new tokens per request, {where}")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return Path(path)

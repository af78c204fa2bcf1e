"""The claims report as markdown: the primary endpoint, one section per claim with its table of options, the
power table, the diagnostics, the checks, every option side by side, and the LLM report's claims when the store
holds them (``LLM_CLAIMS``).
"""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from jensenkv.eval.stats import ALPHA
from jensenkv.report.checks import checks_section
from jensenkv.report.diagnostics import render_diagnostics
from jensenkv.report.endpoints import PAPER_COMPARABLE, PRIMARY, PRIMARY_REASON
from jensenkv.report.table1_format import fmt_signed
from jensenkv.report.verdicts import FAILS, HOLDS, INCONCLUSIVE, MISSING, RULE
from jensenkv.report.publish import shown_path
from jensenkv.store.files import portable
from jensenkv.report.claim_numbers import NAMES, est_interval, fmt_interval, fmt_n, fmt_p, mde_text, metric_digits
from jensenkv.report.claim_entries import Claim, Entry, paper_text
from jensenkv.report.paper_claims import ModelReport


LLM_CLAIMS = "llm_claims.md"  # the LLM report's claims (jensenkv.report.llm_prefill), included as a section


def power_table(claims: list[Claim]) -> pd.DataFrame:
    """Per claim-2 row: prompts / videos, and per metric the SD of the prompt-mean differences and the smallest
    effect detected at 80% power (two-sided 0.05, t on prompt means), beside the estimate and the paper's."""
    rows: dict[str, dict[str, str]] = {}
    for claim in claims:
        if not claim.key.startswith("2 "):
            continue
        metric = next(m for m, n in NAMES.items() if claim.key == f"2 ({n})")
        for e in claim.entries:
            if e.power is None:
                continue
            row = rows.setdefault(e.option, {"option": e.option,
                                             "n prompts / videos": fmt_n(e.power.n, e.power.num_videos)})
            d = metric_digits(metric)
            est = e.power
            row[f"{NAMES[metric]}: d / SD / MDE"] = (f"{fmt_signed(est.delta, d, True)} / "
                                                     f"{fmt_signed(est.sd, d, False)} / {mde_text(est, metric)}")
            if e.paper is not None:
                row[f"paper {NAMES[metric]}"] = f"{e.paper[0]} {fmt_signed(e.paper[1], d, True)}"
    return pd.DataFrame(list(rows.values())).fillna("-")


def _md_table(frame: pd.DataFrame) -> str:
    return frame.to_markdown(index=False, disable_numparse=True) if not frame.empty else "(none)"


def _metric_of(claim: Claim) -> str:
    name = claim.key.split("(", 1)[-1].rstrip(")") if "(" in claim.key else ""
    return next((m for m, n in NAMES.items() if n == name), "delta_p_s")


def entry_row(claim: Claim, e: Entry) -> dict[str, str]:
    metric = _metric_of(claim)
    row = {"option": e.option + (" (primary)" if e.primary else ""), **{c: e.numbers.get(c, "") for c in claim.columns}}
    if e.test is not None:
        row["p raw"] = e.test.text()
        row["p Holm"] = "primary: alone" if e.primary else fmt_p(e.p_adjusted)
    else:
        row["p raw"] = row["p Holm"] = "-"
    row[f"n {claim.units}"] = fmt_n(e.power.n, e.power.num_videos) if e.power is not None else "-"
    row["MDE 80%"] = mde_text(e.power, metric if metric != "delta_p_s_abs" else "delta_p_s")
    if claim.key.startswith("2 ") and metric in PAPER_COMPARABLE:
        row["vs the paper's effect"] = paper_text(e, metric)
    word = claim.fails if e.verdict == FAILS else e.verdict
    row["verdict"] = word + (f" ({portable(e.reason)})" if e.reason else "") + (f" ({e.note})" if e.note else "")
    return row


def render_claim(claim: Claim) -> str:
    lines = [f"### Claim {claim.key}: {claim.title} — **{claim.summary}**", "", claim.statement + ".", ""]
    reasons = {e.reason for e in claim.entries if e.verdict == MISSING}
    if claim.entries and claim.summary == MISSING and len(reasons) == 1:  # one reason for every option: say it once
        lines.append(f"- missing for every option: {portable(reasons.pop())}")
    elif claim.entries:
        lines += [_md_table(pd.DataFrame([entry_row(claim, e) for e in claim.entries])), ""]
    lines += [f"- missing: {portable(m)}" for m in claim.missing]
    return "\n".join(lines).rstrip() + "\n"


def render_primary(entry: Entry | None, correction: str) -> list[str]:
    head = [f"**Primary endpoint (pre-specified):** {PRIMARY.describe(correction)}; {PRIMARY_REASON}. It is "
            "tested alone at 0.05; every other test below is Holm-adjusted within its claim."]
    if entry is None:
        return head + ["", "- missing: no run of that row with and without the correction in the store"]
    if entry.power is None:
        return head + ["", f"- missing: {portable(entry.reason)}"]
    est, d = entry.power, metric_digits(PRIMARY.metric)
    words = {HOLDS: "the correction improves it", FAILS: "the correction makes it worse",
             INCONCLUSIVE: "inconclusive against 0", MISSING: "missing"}[entry.verdict]
    text = (f"d{PRIMARY.metric.upper()} = {fmt_interval(est_interval(est), PRIMARY.metric)}, {entry.test.text()} "
            f"(exact sign flip over {est.n} prompts, {est.num_videos} videos): **{words}**")
    if entry.paper is not None:
        name, effect, test = entry.paper
        against = "excludes" if test.p < ALPHA else "does not exclude"
        text += f"; {against} the paper's {fmt_signed(effect, d, True)} dB ({name}, MAGI-1; {test.text()})"
    text += (f". With this SD of the prompt-mean differences ({fmt_signed(est.sd, d, False)}) the current "
             f"{est.n} prompts detect an effect of {mde_text(est, PRIMARY.metric)} with 80% power.")
    return head + ["", text]


POWER_NOTE = ("The smallest effect each row detects with 80% power (MDE): paired, on prompt means, two-sided "
              "alpha 0.05, from the SD of the prompt-mean differences with the noncentral t distribution (the t "
              "test's power; the sign-flip test's is close to it). An inconclusive row whose MDE is above the "
              "effect one cares about says the store is too small, not that the effect is absent.")


def render(reports: list[ModelReport], results_dir: str | Path, correction: str, bits: int = 2) -> str:
    lines = ["# The paper's claims on this store", "",
             (f"Generated by `python -m jensenkv.report.claims --results {shown_path(results_dir)}` "
              "(`make reproduce-table1` regenerates it). Every number: a mean with its Student-t 95% interval over "
              "**prompts** (replicates averaged within (prompt, seed), seeds within the prompt); d = paired "
              "difference per video, averaged the same way, with its exact two-sided sign-flip p over prompts; "
              "n = prompts / videos; P_S's reference is the same call with the run's own cache in full precision."),
             "", "**Verdict rule.** " + RULE, ""]
    for rep in reports:
        lines += [f"## {rep.model}", "", f"Runs over {rep.opts.selection.context_desc}."]
        if rep.opts.selection.left_out:
            lines += ["", f"Left out ({rep.opts.selection.num_left_out} runs of other contexts, never mixed in; "
                      "what differs from the runs above):"]
            lines += [f"- {portable(x)}" for x in rep.opts.selection.left_out]
        lines += [""] + render_primary(rep.primary, correction) + [""]
        lines += ["| claim | verdict |", "|---|---|"]
        lines += [f"| {c.key}: {c.title} | {c.headline} |" for c in rep.claims]
        lines.append("")
        lines += [render_claim(c) for c in rep.claims]
        lines += ["## Power: the smallest effect each row detects", "", POWER_NOTE, "",
                  _md_table(power_table(rep.claims)), ""]
        lines.append(render_diagnostics(rep.diagnostics))
        lines.append(checks_section(rep.opts, results_dir, correction, bits))
        lines += ["## Every option side by side", "",
                  ("Rows: the store's quantizer options; variants: the corrections and attention-time options "
                   "(paired against 'none' of the same option; seeds pooled where noted; raw p-values, not "
                   "adjusted)."), "", _md_table(rep.options), ""]
    llm = Path(results_dir) / LLM_CLAIMS
    if llm.is_file():  # the LLM partial-prefill claims, as `python -m jensenkv.report.llm_prefill` wrote them
        lines += [llm.read_text().rstrip(), ""]
    return "\n".join(lines).rstrip() + "\n"

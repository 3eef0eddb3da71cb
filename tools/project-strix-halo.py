#!/usr/bin/env python3
"""Projects the decode speed of the Flash q2 file on Strix Halo (gfx1151) from a DS4_HIP_PROFILE log.

Usage: tools/project-strix-halo.py LOG [--bw GBPS] [--launch-us US] [--ctx N] [--tokens N] [--peak GBPS]
                                     [--verify] [--dspark [--draft-frac F]]
  LOG          output of `DS4_HIP_PROFILE=1` (or `=shapes`) `ds4-chat run ...` on the H200 (or any GPU); the first
               "DS4_HIP_PROFILE: device time per kernel" block is the decode profile, and the
               "generation ... (N tokens)" line before it gives the number of forward steps
  --bw         gfx1151 bandwidth the projection assumes, GB/s (default 212)
  --launch-us  cost per kernel launch on gfx1151, microseconds (default 3.9)
  --ctx        context at which attention reads its KV rows (default 2048)
  --peak       bandwidth of the profiled GPU, GB/s, for its "% of peak" column (default 4800, H200)
  --verify     also project the block verify (docs/strix-halo-projection.md, "With the block verify"):
               the time of a verify of n = 2..8 tokens and the decode speed at per-token acceptance
               0.6, 0.8 and 0.95 with the best block length
  --dspark     also project DSpark (docs/strix-halo-projection.md, "With DSpark"): a cycle is a draft
               pass plus the verify of the pending token and the proposed drafts, at ds4's gfx1151
               acceptance and at a reference implementation's
  --draft-frac a measured draft pass as a fraction of a decode step (`bench --speculate dspark` prints
               it); default: the pass's bytes and launches at --bw and --launch-us
Prints a Markdown table per kernel class (docs/strix-halo-projection.md explains the model):
bytes read per token, launches per token, time and GB/s on the profiled GPU, and the projected
gfx1151 time = max(bytes / bw, profiled time) + launches x launch cost, summed to tokens/s, and
the bound without the profiled-time floor (bytes / bw + launches x launch cost).
"""
import argparse
import re
import sys

# Flash shapes (docs/model.md#hyperparameters): the bytes each kernel class reads per decoded token.
N_LAYER, N_EMBD, N_VOCAB, N_HEAD, HEAD_DIM = 43, 4096, 129280, 64, 512
Q_LORA, N_OUT_GROUP, O_LORA = 1024, 8, 1024
N_EXPERT_USED, N_FF_EXP, N_HC, MIX = 6, 2048, 4, 24
RATIO4_LAYERS, RATIO128_LAYERS, WINDOW, TOP_K = 21, 20, 128, 512
IDX_HEAD_DIM = 128

# Bytes per element of each GGML block type: block bytes / block elements.
TYPE_BYTES = {"q8_0": 34 / 32, "f16": 2.0, "iq2_xxs": 66 / 256, "q2_k": 84 / 256, "q4_k": 144 / 256}


def q8(n_in, n_out):
    return n_in * n_out * TYPE_BYTES["q8_0"]


def f16(n_in, n_out):
    return n_in * n_out * 2


def attention_projection_bytes():
    """q_a, q_b, kv, output_a (G groups of O_r rows over D*H/G inputs), output_b per layer."""
    per_layer = (
        q8(N_EMBD, Q_LORA)
        + q8(Q_LORA, N_HEAD * HEAD_DIM)
        + q8(N_EMBD, HEAD_DIM)
        + q8(HEAD_DIM * N_HEAD // N_OUT_GROUP, N_OUT_GROUP * O_LORA)
        + q8(N_OUT_GROUP * O_LORA, N_EMBD)
    )
    return N_LAYER * per_layer


def compressor_pair_bytes():
    """kv + gate F16 projections of every compressor: ratio-4 layers (c=2) have the attention one
    (hd = D) and the indexer one (hd = D_i), ratio-128 layers (c=1) the attention one."""
    r4 = 2 * f16(N_EMBD, 2 * HEAD_DIM) + 2 * f16(N_EMBD, 2 * IDX_HEAD_DIM)
    r128 = 2 * f16(N_EMBD, HEAD_DIM)
    return RATIO4_LAYERS * r4 + RATIO128_LAYERS * r128


def attention_kv_bytes(ctx):
    """f32 KV rows the attention reads per token at context ctx, once for scores, once for values."""
    rows = N_LAYER * min(WINDOW, ctx)
    rows += RATIO4_LAYERS * min(TOP_K, ctx // 4) + RATIO128_LAYERS * (ctx // 128)
    return 2 * rows * HEAD_DIM * 4


def expert_bytes(kernel, matrices):
    """Routed experts: n_expert_used matrices (gate+up = 2, down = 1) of F x E per layer; the type is
    the kernel name's suffix (before `_fast` and the quantizing gate/up's `_q8k`)."""
    name = kernel.removesuffix("_fast").removesuffix("_q8k")
    for ty, b in TYPE_BYTES.items():
        if name.endswith(ty):
            return N_LAYER * N_EXPERT_USED * matrices * N_FF_EXP * N_EMBD * b
    return 0.0


# (class label, kernel name prefixes, bytes per token as a function of (kernel, ctx), None where the
# class reads only activations). The first class with a matching prefix takes a kernel.
CLASSES = [
    ("Q8_0 shared expert gate+up (SwiGLU)", ["ds4_matvec_q8_0_swiglu"], lambda k, c: N_LAYER * 2 * q8(N_EMBD, N_FF_EXP)),
    (
        "Q8_0 matvec: attention q_a/q_b/kv/out_a/out_b, shared down, LM head",
        ["ds4_matvec_q8_0"],
        lambda k, c: attention_projection_bytes() + N_LAYER * q8(N_FF_EXP, N_EMBD) + q8(N_EMBD, N_VOCAB),
    ),
    ("routed experts gate+up (fast: with its output's Q8_K)", ["ds4_moe_gate_up_"], lambda k, c: expert_bytes(k, 2)),
    ("routed experts down", ["ds4_moe_down_"], lambda k, c: expert_bytes(k, 1)),
    ("F16 compressor kv+gate pairs", ["ds4_matvec_f16_pair"], lambda k, c: compressor_pair_bytes()),
    ("F16 router logits (fast: with the selection)", ["ds4_matvec_f16"], lambda k, c: N_LAYER * f16(N_EMBD, 256)),
    ("HC pre (Sinkhorn mix, norm; fused with the previous HC post)", ["ds4_hc_pre", "ds4_hc_post_pre", "ds4_hc_mix"], lambda k, c: 2 * N_LAYER * f16(N_HC * N_EMBD, MIX)),
    ("attention core (scores, softmax, values)", ["ds4_attention_"], lambda k, c: attention_kv_bytes(c)),
    ("RMSNorm + quantize", ["ds4_rms_norm_quant"], None),
    ("row finish (norms, RoPE, simulations)", ["ds4_rows_finish"], None),
    ("HC post", ["ds4_hc_post"], None),
    ("router top-k", ["ds4_router"], None),
    ("compressor pool", ["ds4_compressor_pool"], None),
    ("indexer", ["ds4_indexer_"], None),
    ("output head, sampling, embedding", [""], None),
]


def classify(kernel):
    for i, (_, patterns, _) in enumerate(CLASSES):
        if any(kernel.startswith(p) for p in patterns):
            return i
    return len(CLASSES) - 1


PROFILE_HEAD = "DS4_HIP_PROFILE: device time per kernel"
# A row: the kernel, in DS4_HIP_PROFILE=shapes logs its launch shape (" grid AxBxC name=v ..."), then
# calls, ms, share and us/call.
ROW = re.compile(
    r"^\s+(\S+)(?:\s+grid \d+x\d+x\d+(?:\s+\w+=\d+)*)?\s+(\d+) calls\s+([\d.]+) ms\s+[\d.]+%\s+[\d.]+ us/call\s*$"
)
GENERATION = re.compile(r"generation [\d.]+ t/s \((\d+) tokens\)")


def parse_profile(text):
    """(steps, [(kernel, calls, ms)]) of the first DS4_HIP_PROFILE block, the rows of one kernel's
    launch shapes summed (in the order each kernel first appears); steps from the last
    "generation ... (N tokens)" line before it, or None."""
    steps, rows, inside = None, [], False
    for line in text.splitlines():
        if not inside:
            m = GENERATION.search(line)
            if m:
                steps = int(m.group(1))
            if PROFILE_HEAD in line:
                inside = True
            continue
        m = ROW.match(line)
        if not m:
            break
        rows.append((m.group(1), int(m.group(2)), float(m.group(3))))
    summed = {}
    for kernel, calls, ms in rows:
        c, t = summed.get(kernel, (0, 0.0))
        summed[kernel] = (c + calls, t + ms)
    return steps, [(k, c, round(t, 6)) for k, (c, t) in summed.items()]


def project(rows, steps, bw_gbps, launch_us, ctx, peak_gbps):
    """Per-class dicts and the totals, per decoded token."""
    classes = {}
    for kernel, calls, ms in rows:
        i = classify(kernel)
        label, _, bytes_fn = CLASSES[i]
        c = classes.setdefault(i, {"class": label, "bytes": 0.0, "launches": 0.0, "ms": 0.0, "kernels": []})
        c["launches"] += calls / steps
        c["ms"] += ms / steps
        c["kernels"].append(kernel)
        if bytes_fn is not None:
            c["bytes"] = max(c["bytes"], bytes_fn(kernel, ctx))
    out = []
    for i in sorted(classes):
        c = classes[i]
        c["gbps"] = c["bytes"] / (c["ms"] * 1e6) if c["ms"] > 0 else 0.0
        c["peak_pct"] = 100 * c["gbps"] / peak_gbps
        c["bw_ms"] = c["bytes"] / (bw_gbps * 1e6)
        c["launch_ms"] = c["launches"] * launch_us / 1e3
        c["proj_ms"] = max(c["bw_ms"], c["ms"]) + c["launch_ms"]
        out.append(c)
    total = {k: sum(c[k] for c in out) for k in ("bytes", "launches", "ms", "bw_ms", "launch_ms", "proj_ms")}
    total["tps"] = 1e3 / total["proj_ms"]
    # Lower bound on time: small kernels finish inside their launch slot, only bytes and launches count.
    total["lean_tps"] = 1e3 / (total["bw_ms"] + total["launch_ms"])
    total["bw_only_tps"] = 1e3 / total["bw_ms"]
    return out, total


# Classes whose weight reads a verify of n tokens repeats per token: the routed experts (each token's
# own 6; shared ones are not counted, so this is an upper bound) and the attention's KV rows (each
# query row reads its own). Every other class reads its weights once per block (the small-batch
# products), and its latency floor is paid once, as the block's tokens run side by side.
PER_TOKEN_CLASSES = ("routed experts", "attention core")
# Launches a verify adds to a decode step: the state keep and the last row's logits copy (block.rs).
VERIFY_EXTRA_LAUNCHES = 2
ACCEPTANCES = (0.6, 0.8, 0.95)
# The longest block the decode loop verifies: a token and at most 5 drafts (engine::generate::MAX_DRAFT).
MAX_BLOCK = 6


def verify_ms(out, n, bw_gbps, launch_us):
    """Projected gfx1151 time of a verify of n tokens: per class max(bytes_n / bw, profiled floor) +
    launches x launch cost, bytes_n = n x bytes for the per-token classes, else the step's bytes."""
    ms = VERIFY_EXTRA_LAUNCHES * launch_us / 1e3
    for c in out:
        scale = n if c["class"].startswith(PER_TOKEN_CLASSES) else 1
        ms += max(scale * c["bytes"] / (bw_gbps * 1e6), c["ms"]) + c["launch_ms"]
    return ms


def tokens_per_cycle(a, n):
    """Expected tokens a cycle of n verified tokens (1 + n - 1 drafts) yields at per-token
    acceptance a: 1 + a + ... + a^(n-1)."""
    return sum(a**i for i in range(n))


def verify_markdown(out, total, a):
    step = total["proj_ms"]
    lines = ["| tokens in the block | GB read | projected ms | x decode step |", "|---:|---:|---:|---:|"]
    for n in range(1, MAX_BLOCK + 1):
        gb = sum((n if c["class"].startswith(PER_TOKEN_CLASSES) else 1) * c["bytes"] for c in out) / 1e9
        ms = step if n == 1 else verify_ms(out, n, a.bw, a.launch_us)
        lines.append(f"| {n} | {gb:.2f} | {ms:.2f} | {ms / step:.2f} |")
    lines += ["", "| acceptance | best block | tokens per cycle | projected t/s | x plain decode |", "|---:|---:|---:|---:|---:|"]
    for acc in ACCEPTANCES:
        n, tps = max(((n, 1e3 * tokens_per_cycle(acc, n) / verify_ms(out, n, a.bw, a.launch_us)) for n in range(2, MAX_BLOCK + 1)), key=lambda x: x[1])
        lines.append(f"| {acc} | {n} | {tokens_per_cycle(acc, n):.2f} | {tps:.1f} | {tps / total['tps']:.2f} |")
    return "\n".join(lines)


# DSpark's draft pass (docs/dspark.md#cost), Flash shapes and ds4's support-file types: a stage's
# dense tensors (attention, router, shared expert, HC fn and vectors), one routed expert's gate, up
# and down, main_proj + main_norm, the head (final norm, HC head), markov_w2 per drafted row, the
# markov_w1 row and the confidence head per row read, the main model's Q8_0 LM head once.
DSPARK_STAGES = 3
DSPARK_STAGE_DENSE = (
    q8(N_EMBD, Q_LORA) + q8(Q_LORA, N_HEAD * HEAD_DIM) + q8(N_EMBD, HEAD_DIM)
    + q8(HEAD_DIM * N_HEAD // N_OUT_GROUP, N_OUT_GROUP * O_LORA) + q8(N_OUT_GROUP * O_LORA, N_EMBD)
    + q8(N_EMBD, 256) + 3 * q8(N_EMBD, N_FF_EXP) + 2 * f16(N_HC * N_EMBD, MIX)
    + 4 * (2 * MIX + 2 * 3 + N_HEAD + 2 * N_EMBD + Q_LORA + HEAD_DIM + 256)
)
DSPARK_EXPERT = 2 * N_EMBD * N_FF_EXP * TYPE_BYTES["iq2_xxs"] + N_FF_EXP * N_EMBD * TYPE_BYTES["q2_k"]
DSPARK_MAIN_PROJ = q8(3 * N_EMBD, N_EMBD) + 4 * N_EMBD
DSPARK_HEAD = 4 * N_EMBD + f16(N_HC * N_EMBD, N_HC) + 4 * (N_HC + 1)
MARKOV_RANK = 256
DSPARK_MARKOV_W2 = q8(MARKOV_RANK, N_VOCAB)
DSPARK_ROW_READS = q8(MARKOV_RANK, 1) + q8(N_EMBD + MARKOV_RANK, 1)
LM_HEAD = q8(N_EMBD, N_VOCAB)
# Launches of the pass besides its stages (the HC head, the final norm, the LM head, the Markov
# products, the confidence products and the argmax).
DSPARK_HEAD_LAUNCHES = 6
# Acceptance scenarios: (name, accepted drafts per cycle, drafts proposed per cycle, source).
# ds4 on gfx1151 (ds4 issue #695, IQ2XXS 0731, code at ctx 8192, confidence 0.7): accept rate 0.83 =
# accepted / proposed, 0.83 accepted drafts per cycle, so 1.0 draft proposed a cycle.
# The reference as vLLM runs it on 0731 (vllm-project/vllm PR #41834, k = 5, prose): mean
# acceptance length 2.74, i.e. 1.74 accepted of 5 drafts a cycle (per position 0.579, 0.447,
# 0.316, 0.237, 0.158). No source gives DeepSeek's training-time acceptance for V4 Flash.
DSPARK_SCENARIOS = (
    ("ds4 on gfx1151, confidence 0.7", 0.83, 1.0),
    ("reference in vLLM, 5 drafts", 1.74, 5.0),
)


def dspark_pass_bytes(experts=28, rows=5, lm_head=True):
    """Bytes a draft pass reads with `experts` distinct experts a stage and `rows` drafted rows."""
    b = DSPARK_STAGES * (DSPARK_STAGE_DENSE + experts * DSPARK_EXPERT) + DSPARK_MAIN_PROJ + DSPARK_HEAD
    b += rows * (DSPARK_MARKOV_W2 + DSPARK_ROW_READS)
    return b + (LM_HEAD if lm_head else 0)


def dspark_draft_ms(out, total, bw_gbps, launch_us, pass_bytes):
    """Projected gfx1151 time of a draft pass: its bytes over the bandwidth, the latency floors of a
    decode step's classes beyond their bytes scaled to 3 of its 43 layers, and a layer's share of
    the step's launches per stage plus the head's."""
    per_layer = DSPARK_STAGES / N_LAYER
    floors = sum(max(0.0, c["ms"] - c["bw_ms"]) for c in out) * per_layer
    launches = total["launches"] * per_layer + DSPARK_HEAD_LAUNCHES
    return pass_bytes / (bw_gbps * 1e6) + floors + launches * launch_us / 1e3


def dspark_cycle(out, total, a, accepted, proposed, draft_ms):
    """One cycle: a draft pass, then the verify of the pending token and the `proposed` drafts (a
    mean: verify_ms interpolated linearly between whole blocks); it yields 1 + accepted tokens."""
    n = 1 + proposed
    lo = int(n)
    frac = n - lo
    verify = (1 - frac) * verify_ms(out, lo, a.bw, a.launch_us)
    if frac > 0:
        verify += frac * verify_ms(out, lo + 1, a.bw, a.launch_us)
    cycle = draft_ms + verify
    tps = 1e3 * (1 + accepted) / cycle
    return {"verify_ms": verify, "cycle_ms": cycle, "tps": tps, "x_plain": tps / total["tps"]}


def dspark_markdown(out, total, a):
    step = total["proj_ms"]
    if a.draft_frac is not None:
        draft, src = a.draft_frac * step, f"--draft-frac {a.draft_frac}"
    else:
        b = dspark_pass_bytes()
        draft = dspark_draft_ms(out, total, a.bw, a.launch_us, b)
        src = f"{b / 1e9:.3f} GB a pass (28 experts a stage, 5 rows, the LM head)"
    lines = [
        f"draft pass: {draft:.2f} ms = {draft / step:.3f} of a decode step ({src}); "
        f"a verify adds {(verify_ms(out, 2, a.bw, a.launch_us) - verify_ms(out, 1, a.bw, a.launch_us)) / step:.3f} "
        "of a step per draft",
        "",
        "| acceptance | accepted drafts per cycle | drafts per cycle | draft ms | verify ms | cycle ms | tokens per cycle | projected t/s | x plain decode |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, accepted, proposed in DSPARK_SCENARIOS:
        c = dspark_cycle(out, total, a, accepted, proposed, draft)
        lines.append(
            f"| {name} | {accepted:.2f} | {proposed:.2f} | {draft:.2f} | {c['verify_ms']:.2f} | "
            f"{c['cycle_ms']:.2f} | {1 + accepted:.2f} | {c['tps']:.1f} | {c['x_plain']:.2f} |"
        )
    return "\n".join(lines)


def markdown(out, total, a):
    lines = [
        f"| class | GB/token | launches/token | profiled ms/token | profiled GB/s (% of {a.peak:.0f}) "
        f"| gfx1151 ms at {a.bw:.0f} GB/s | launch ms at {a.launch_us} us | projected ms |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for c in out:
        lines.append(
            f"| {c['class']} | {c['bytes'] / 1e9:.3f} | {c['launches']:.1f} | {c['ms']:.3f} | "
            f"{c['gbps']:.0f} ({c['peak_pct']:.1f}%) | {c['bw_ms']:.2f} | {c['launch_ms']:.2f} | {c['proj_ms']:.2f} |"
        )
    lines.append(
        f"| **total** | **{total['bytes'] / 1e9:.3f}** | **{total['launches']:.1f}** | **{total['ms']:.3f}** | "
        f"{total['bytes'] / (total['ms'] * 1e6):.0f} | **{total['bw_ms']:.2f}** | **{total['launch_ms']:.2f}** | "
        f"**{total['proj_ms']:.2f}** |"
    )
    lines.append("")
    lines.append(
        f"projected gfx1151 decode: {total['tps']:.1f} t/s; bytes + launches only: {total['lean_tps']:.1f} t/s; "
        f"bandwidth alone: {total['bw_only_tps']:.1f} t/s (ctx {a.ctx}, {a.steps} profiled steps)"
    )
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("log")
    ap.add_argument("--bw", type=float, default=212.0)
    ap.add_argument("--launch-us", type=float, default=3.9)
    ap.add_argument("--ctx", type=int, default=2048)
    ap.add_argument("--tokens", type=int)
    ap.add_argument("--peak", type=float, default=4800.0)
    ap.add_argument("--verify", action="store_true")
    ap.add_argument("--dspark", action="store_true")
    ap.add_argument("--draft-frac", type=float)
    a = ap.parse_args()
    try:
        with open(a.log, errors="replace") as f:
            text = f.read()
    except OSError as e:
        sys.exit(f"project-strix-halo: cannot read {a.log}: {e.strerror}")
    steps, rows = parse_profile(text)
    if not rows:
        sys.exit(f"project-strix-halo: {a.log}: no '{PROFILE_HEAD}' block with kernel rows")
    a.steps = a.tokens or steps
    if not a.steps:
        sys.exit(f"project-strix-halo: {a.log}: no 'generation ... (N tokens)' line; pass --tokens N")
    out, total = project(rows, a.steps, a.bw, a.launch_us, a.ctx, a.peak)
    print(markdown(out, total, a))
    if a.verify:
        print()
        print(verify_markdown(out, total, a))
    if a.dspark:
        print()
        print(dspark_markdown(out, total, a))


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Per-kernel resource use of the gfx1151 (Strix Halo) code object, read from its own AMDGPU
metadata note (the `amdhsa.kernels` list that `llvm-readelf --notes` prints).

Usage:
  tools/kernel-metadata.py [--hsaco FILE | --notes FILE] [--arch gfx1151] [--hot] [--check]
    default: builds kernels/ds4.hip for the arch with tools/build-kernels-amd.sh into
    target/kernel-metadata/<hash of the kernel sources>/ (reused while the sources are unchanged)
    --hsaco FILE  read an existing code object instead
    --notes FILE  read saved `llvm-readelf --notes` text (tests)
    --hot         print only the hot kernels (fast-mode decode and prefill)
    --check       exit 1 when a hot kernel uses scratch (spills or a private stack)
Prints a Markdown table: VGPRs, SGPRs, LDS bytes (group segment), scratch bytes (private segment),
VGPR/SGPR spill counts, wavefront size and the waves per SIMD the VGPR count allows.

Waves per SIMD from VGPRs, gfx1151 in wave32 (LLVM AMDGPU backend, AMDGPUBaseInfo.cpp
getTotalNumVGPRs / getVGPRAllocGranule / getMaxWavesPerEU; gfx1151 = FeatureISAVersion11_5_1,
which carries the 1.5x VGPR feature): 1536 VGPRs per SIMD lane, allocated in granules of 24,
at most 16 waves per SIMD. waves = min(16, 1536 // roundup(vgprs, 24)).
LDS: 128 KiB per WGP (two CUs, four SIMDs; the kernels run in WGP mode), so a workgroup of
max_flat_workgroup_size threads using L bytes allows (131072 // L) workgroups per WGP, i.e.
(131072 // L) * (workgroup waves) / 4 waves per SIMD. The smaller of the two equals the "; Occupancy"
clang-19 writes into the gfx1151 assembly for every kernel of kernels/ds4.hip.
"""
import argparse
import fnmatch
import hashlib
import os
import shutil
import subprocess
import sys

VGPRS_PER_SIMD_WAVE32 = 1536
VGPR_GRANULE_WAVE32 = 24
MAX_WAVES_PER_SIMD = 16
LDS_PER_WGP = 131072
SIMDS_PER_WGP = 4

# The kernels that fast-mode decode and prefill run (ds4_*_fast, the matrix-core *_mma GEMMs and the
# shared steps that have no fast twin).
HOT_PATTERNS = [
    "ds4_*_fast",
    "*_mma",
    "ds4_rms_norm_quant",
    "ds4_attention_*",
    "ds4_moe_gate_up_*",
    "ds4_moe_down_*",
    "ds4_rows_finish",
    "ds4_hc_post",
    "ds4_router",
    "ds4_compressor_pool",
]

FIELDS = {
    ".name": "name",
    ".vgpr_count": "vgpr",
    ".sgpr_count": "sgpr",
    ".group_segment_fixed_size": "lds",
    ".private_segment_fixed_size": "scratch",
    ".vgpr_spill_count": "vgpr_spill",
    ".sgpr_spill_count": "sgpr_spill",
    ".wavefront_size": "wave",
    ".uses_dynamic_stack": "dynamic_stack",
    ".max_flat_workgroup_size": "wg_size",
}


def is_hot(name):
    return any(fnmatch.fnmatchcase(name, p) for p in HOT_PATTERNS)


def waves_per_simd(vgprs, wave=32):
    """Waves per SIMD that `vgprs` allow on gfx1151 (wave64 uses half the file and granule)."""
    total, granule = VGPRS_PER_SIMD_WAVE32, VGPR_GRANULE_WAVE32
    if wave == 64:
        total, granule = total // 2, granule // 2
    alloc = max(granule, -(-vgprs // granule) * granule)
    return min(MAX_WAVES_PER_SIMD, total // alloc)


def waves_per_simd_lds(lds, wg_size, wave=32):
    """Waves per SIMD that `lds` bytes per workgroup of `wg_size` threads allow on one WGP."""
    if lds == 0:
        return MAX_WAVES_PER_SIMD
    groups = LDS_PER_WGP // lds
    return min(MAX_WAVES_PER_SIMD, groups * -(-wg_size // wave) // SIMDS_PER_WGP)


def parse_notes(text):
    """Kernels of an `llvm-readelf --notes` dump: a list of dicts with the FIELDS values."""
    kernels, cur, in_kernels = [], None, False
    for line in text.splitlines():
        if line.startswith("amdhsa.kernels:"):
            in_kernels = True
            continue
        if in_kernels and line and not line.startswith(" "):
            in_kernels = False  # the next top-level key (amdhsa.target, ...)
        if not in_kernels:
            continue
        stripped = line.strip()
        if line.startswith("  - "):  # a new kernel entry (its first key is .args)
            cur = {}
            kernels.append(cur)
            stripped = stripped[2:]
        key, _, value = stripped.partition(":")
        # Kernel-level keys sit at indentation 4; deeper ones belong to .args entries.
        if cur is None or key not in FIELDS or not (line.startswith("    .") or line.startswith("  - .")):
            continue
        value = value.strip()
        if key == ".name":
            cur["name"] = value
        elif key == ".uses_dynamic_stack":
            cur["dynamic_stack"] = value == "true"
        else:
            cur[FIELDS[key]] = int(value)
    out = []
    for k in kernels:
        if "name" not in k:
            continue
        for f in ("vgpr", "sgpr", "lds", "scratch", "vgpr_spill", "sgpr_spill"):
            k.setdefault(f, 0)
        k.setdefault("wave", 32)
        k.setdefault("dynamic_stack", False)
        k.setdefault("wg_size", 256)
        k["waves"] = waves_per_simd(k["vgpr"], k["wave"])
        k["occupancy"] = min(k["waves"], waves_per_simd_lds(k["lds"], k["wg_size"], k["wave"]))
        k["hot"] = is_hot(k["name"])
        out.append(k)
    return out


def uses_scratch(k):
    return k["scratch"] > 0 or k["vgpr_spill"] > 0 or k["dynamic_stack"]


def markdown(kernels):
    rows = [
        "| kernel | VGPRs | SGPRs | LDS B | scratch B | VGPR/SGPR spills | wave | waves/SIMD by VGPRs "
        "| waves/SIMD by VGPRs and LDS |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for k in sorted(kernels, key=lambda k: k["name"]):
        rows.append(
            f"| {k['name']} | {k['vgpr']} | {k['sgpr']} | {k['lds']} | {k['scratch']} | "
            f"{k['vgpr_spill']}/{k['sgpr_spill']} | {k['wave']} | {k['waves']} | {k['occupancy']} |"
        )
    return "\n".join(rows)


def repo_root():
    return os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def sources_hash(root):
    h = hashlib.sha256()
    for d, files in (("kernels", None), ("tools", ["build-kernels-amd.sh"])):
        base = os.path.join(root, d)
        for dirpath, _, names in sorted(os.walk(base)):
            for n in sorted(names):
                if files is not None and n not in files:
                    continue
                if dirpath != base and d == "tools":
                    continue
                p = os.path.join(dirpath, n)
                h.update(os.path.relpath(p, root).encode())
                with open(p, "rb") as f:
                    h.update(f.read())
    return h.hexdigest()[:16]


def find_readelf():
    for c in ("llvm-readelf-19", "/usr/lib/llvm-19/bin/llvm-readelf", "llvm-readelf"):
        p = shutil.which(c)
        if p:
            return p
    return None


def build(root, arch):
    out = os.path.join(root, "target", "kernel-metadata", sources_hash(root))
    obj = os.path.join(out, f"ds4_kernels.{arch}.hsaco")
    if not os.path.exists(obj):
        # Built beside the cache entry and moved in whole, so an interrupted build is never reused.
        tmp = f"{out}.tmp-{os.getpid()}"
        r = subprocess.run(
            ["bash", os.path.join(root, "tools", "build-kernels-amd.sh"), tmp, arch],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        if r.returncode != 0:
            sys.exit(f"kernel-metadata: building {arch} failed:\n{r.stdout.strip()}")
        os.makedirs(out, exist_ok=True)
        os.replace(os.path.join(tmp, os.path.basename(obj)), obj)
        shutil.rmtree(tmp, ignore_errors=True)
    return obj


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hsaco")
    ap.add_argument("--notes")
    ap.add_argument("--arch", default="gfx1151")
    ap.add_argument("--hot", action="store_true")
    ap.add_argument("--check", action="store_true")
    a = ap.parse_args()
    if a.notes:
        try:
            with open(a.notes) as f:
                text = f.read()
        except OSError as e:
            sys.exit(f"kernel-metadata: cannot read {a.notes}: {e.strerror}")
    else:
        readelf = find_readelf()
        if readelf is None:
            sys.exit("kernel-metadata: llvm-readelf not found (apt-get install llvm-19)")
        obj = a.hsaco or build(repo_root(), a.arch)
        r = subprocess.run([readelf, "--notes", obj], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        if r.returncode != 0:
            sys.exit(f"kernel-metadata: llvm-readelf --notes {obj}: {r.stderr.strip()}")
        text = r.stdout
    kernels = parse_notes(text)
    if not kernels:
        sys.exit("kernel-metadata: no amdhsa.kernels metadata in the input")
    shown = [k for k in kernels if k["hot"]] if a.hot else kernels
    print(markdown(shown))
    print(
        f"\n{len(kernels)} kernels, {sum(k['hot'] for k in kernels)} hot; waves/SIMD for gfx1151 wave32: "
        f"{VGPRS_PER_SIMD_WAVE32} VGPRs per SIMD, granule {VGPR_GRANULE_WAVE32}, at most {MAX_WAVES_PER_SIMD}"
    )
    scratch = [k for k in kernels if uses_scratch(k)]
    for k in scratch:
        print(
            f"scratch: {k['name']}{' (HOT)' if k['hot'] else ''}: {k['scratch']} B private segment, "
            f"{k['vgpr_spill']} VGPR spills"
        )
    hot_spills = [k["name"] for k in scratch if k["hot"]]
    if a.check and hot_spills:
        print(f"kernel-metadata: hot kernels use scratch: {', '.join(hot_spills)}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()

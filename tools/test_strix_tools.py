#!/usr/bin/env python3
"""Unit tests of tools/kernel-metadata.py (metadata-note parsing, waves per SIMD, the hot-kernel
scratch check) and tools/project-strix-halo.py (profile-log parsing, bytes per kernel class, the
block verify and DSpark projections).
Run: python3 tools/test_strix_tools.py (tests/kernel_metadata.rs runs it)."""
import importlib.util
import os
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def load(name, file):
    spec = importlib.util.spec_from_file_location(name, os.path.join(HERE, file))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


meta = load("kernel_metadata", "kernel-metadata.py")
proj = load("project_strix_halo", "project-strix-halo.py")


def kernel_note(name, vgpr, sgpr, lds, scratch, vgpr_spill=0, sgpr_spill=0):
    """One amdhsa.kernels entry as llvm-readelf 19 prints it, with an .args list in front."""
    return f"""  - .args:
      - .address_space:  global
        .offset:         0
        .size:           8
        .value_kind:     global_buffer
      - .offset:         8
        .size:           4
        .value_kind:     by_value
    .group_segment_fixed_size: {lds}
    .kernarg_segment_align: 8
    .kernarg_segment_size: 12
    .language:       OpenCL C
    .language_version:
      - 2
      - 0
    .max_flat_workgroup_size: 256
    .name:           {name}
    .private_segment_fixed_size: {scratch}
    .sgpr_count:     {sgpr}
    .sgpr_spill_count: {sgpr_spill}
    .symbol:         {name}.kd
    .uniform_work_group_size: 1
    .uses_dynamic_stack: false
    .vgpr_count:     {vgpr}
    .vgpr_spill_count: {vgpr_spill}
    .wavefront_size: 32
    .workgroup_processor_mode: 1
"""


def notes(*kernels):
    return (
        "Displaying notes found in: .note\n  Owner                Data size \tDescription\n"
        "  AMDGPU               0x0000e316\tNT_AMDGPU_METADATA (AMDGPU Metadata)\n"
        "    AMDGPU Metadata:\n        ---\namdhsa.kernels:\n"
        + "".join(kernels)
        + "amdhsa.target:   amdgcn-amd-amdhsa--gfx1151\namdhsa.version:\n  - 1\n  - 2\n...\n"
    )


class KernelMetadata(unittest.TestCase):
    def test_parses_every_kernel_field(self):
        ks = meta.parse_notes(
            notes(
                kernel_note("ds4_matvec_q8_0_fast", 94, 22, 0, 0),
                kernel_note("ds4_moe_gemm_down_q2_k", 256, 39, 23056, 532, vgpr_spill=255),
            )
        )
        self.assertEqual([k["name"] for k in ks], ["ds4_matvec_q8_0_fast", "ds4_moe_gemm_down_q2_k"])
        a, b = ks
        self.assertEqual((a["vgpr"], a["sgpr"], a["lds"], a["scratch"], a["wave"]), (94, 22, 0, 0, 32))
        self.assertEqual((b["vgpr"], b["lds"], b["scratch"], b["vgpr_spill"]), (256, 23056, 532, 255))
        self.assertTrue(a["hot"])
        self.assertFalse(b["hot"])
        self.assertFalse(meta.uses_scratch(a))
        self.assertTrue(meta.uses_scratch(b))

    def test_waves_per_simd_follow_the_gfx1151_vgpr_file(self):
        # 1536 VGPRs per SIMD in granules of 24, at most 16 waves.
        self.assertEqual(meta.waves_per_simd(1), 16)
        self.assertEqual(meta.waves_per_simd(96), 16)
        self.assertEqual(meta.waves_per_simd(97), 1536 // 120)  # 12
        self.assertEqual(meta.waves_per_simd(172), 8)
        self.assertEqual(meta.waves_per_simd(206), 1536 // 216)  # 7
        self.assertEqual(meta.waves_per_simd(256), 5)
        self.assertEqual(meta.waves_per_simd(100, wave=64), 768 // 108)  # 7

    def test_lds_limits_waves_per_wgp(self):
        # 128 KiB per WGP shared by four SIMDs; 256-thread workgroups are 8 waves. These equal the
        # "; Occupancy" clang-19 prints for ds4_hc_pre_fused, ds4_matvec_f16, ds4_gemm_q8_0_mma.
        self.assertEqual(meta.waves_per_simd_lds(33312, 256), 6)
        self.assertEqual(meta.waves_per_simd_lds(16672, 256), 14)
        self.assertEqual(meta.waves_per_simd_lds(30720, 256), 8)
        self.assertEqual(meta.waves_per_simd_lds(64, 256), 16)
        self.assertEqual(meta.waves_per_simd_lds(0, 256), 16)
        k = meta.parse_notes(notes(kernel_note("ds4_hc_pre_fused", 44, 93, 33312, 0)))[0]
        self.assertEqual((k["wg_size"], k["waves"], k["occupancy"]), (256, 16, 6))

    def test_hot_set(self):
        for n in [
            "ds4_matvec_q8_0_fast",
            "ds4_hc_pre_fused_fast",
            "ds4_gemm_q8_0_mma",
            "ds4_moe_gemm_gate_up_q2_k_mma",
            "ds4_rms_norm_quant",
            "ds4_attention_values",
            "ds4_moe_gate_up_iq2_xxs",
            "ds4_moe_down_q4_k",
            "ds4_rows_finish",
            "ds4_hc_post",
            "ds4_router",
            "ds4_compressor_pool",
        ]:
            self.assertTrue(meta.is_hot(n), n)
        for n in ["ds4_matvec_q8_0", "ds4_hc_pre_fused", "ds4_moe_gemm_gate_up_q2_k", "ds4_gemm_q8_0", "ds4_embed_hc"]:
            self.assertFalse(meta.is_hot(n), n)

    def check_rc(self, text):
        with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as f:
            f.write(text)
        try:
            r = subprocess.run(
                [sys.executable, os.path.join(HERE, "kernel-metadata.py"), "--notes", f.name, "--check"],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        finally:
            os.unlink(f.name)
        return r

    def test_check_fails_only_on_a_hot_kernel_with_scratch(self):
        cold = self.check_rc(notes(kernel_note("ds4_moe_gemm_down_q2_k", 256, 39, 0, 532, vgpr_spill=255)))
        self.assertEqual(cold.returncode, 0, cold.stderr)
        self.assertIn("scratch: ds4_moe_gemm_down_q2_k: 532 B", cold.stdout)
        hot = self.check_rc(notes(kernel_note("ds4_moe_gemm_down_q2_k_mma", 256, 39, 0, 16, vgpr_spill=4)))
        self.assertEqual(hot.returncode, 1)
        self.assertIn("hot kernels use scratch: ds4_moe_gemm_down_q2_k_mma", hot.stderr)
        empty = self.check_rc("no notes here\n")
        self.assertNotEqual(empty.returncode, 0)
        self.assertIn("no amdhsa.kernels metadata", empty.stderr)


PROFILE_LOG = """== launches per decode step
ds4-chat: prompt 17 tokens, prefill 226.23 t/s, generation 55.00 t/s (4 tokens)
DS4_HIP_PROFILE: device time per kernel (10.0 ms in all)
  ds4_matvec_q8_0_fast              1036 calls       8.00 ms   80.0%     7.72 us/call
  ds4_matvec_q8_0_swiglu_fast        172 calls       1.00 ms   10.0%     5.81 us/call
  ds4_moe_gate_up_iq2_xxs            172 calls       0.60 ms    6.0%     3.49 us/call
  ds4_rms_norm_quant                 864 calls       0.40 ms    4.0%     0.46 us/call

== per-kernel prefill time
DS4_HIP_PROFILE: device time per kernel (99.0 ms in all)
  ds4_gemm_q8_0_mma                  516 calls      99.00 ms  100.0%   191.86 us/call
"""


class Projection(unittest.TestCase):
    def test_parses_the_first_profile_block_and_its_step_count(self):
        steps, rows = proj.parse_profile(PROFILE_LOG)
        self.assertEqual(steps, 4)
        self.assertEqual(
            rows,
            [
                ("ds4_matvec_q8_0_fast", 1036, 8.0),
                ("ds4_matvec_q8_0_swiglu_fast", 172, 1.0),
                ("ds4_moe_gate_up_iq2_xxs", 172, 0.6),
                ("ds4_rms_norm_quant", 864, 0.4),
            ],
        )

    def test_per_shape_rows_are_summed_per_kernel(self):
        log = """ds4-chat: prompt 17 tokens, prefill 248.25 t/s, generation 68.92 t/s (64 tokens)
DS4_HIP_PROFILE: device time per kernel (3.0 ms in all)
  ds4_matvec_q8_0_fast         grid 256x1x1 n_in=8192 n_out=4096 rows_per_group=4096 x_stride=8192     2709 calls      1.50 ms   50.0%    16.62 us/call
  ds4_router                   grid 1x1x1 n_expert=256 n_used=6 n_tok=1     2709 calls      0.50 ms   16.7%     9.26 us/call
  ds4_matvec_q8_0_fast         grid 64x1x1 n_in=4096 n_out=512 rows_per_group=512 x_stride=4096     2709 calls      1.00 ms   33.3%     7.14 us/call
"""
        steps, rows = proj.parse_profile(log)
        self.assertEqual(steps, 64)
        self.assertEqual(rows, [("ds4_matvec_q8_0_fast", 5418, 2.5), ("ds4_router", 2709, 0.5)])

    def test_classes_and_bytes_match_the_model_accounting(self):
        # docs/model.md#weight-bytes-per-token: attention projections 4660 MiB, shared expert
        # 1097 MiB, LM head 537 MiB, routed experts (q2) 1741 MiB.
        self.assertEqual(proj.attention_projection_bytes(), 4_886_495_232)
        self.assertEqual(round(proj.attention_projection_bytes() / 2**20), 4660)
        shared = 3 * proj.N_LAYER * proj.q8(4096, 2048)
        self.assertEqual(shared, 1_149_763_584)  # 1096.5 MiB, printed as 1097
        self.assertEqual(round(proj.q8(4096, 129280) / 2**20), 537)
        routed = proj.expert_bytes("ds4_moe_gate_up_iq2_xxs", 2) + proj.expert_bytes("ds4_moe_down_q2_k", 1)
        self.assertEqual(routed, 1_826_095_104)  # 43 x 6 x 7,077,888 B per expert
        # The fast twins, and the gate/up that also quantizes its output, read the same matrices.
        fused = proj.expert_bytes("ds4_moe_gate_up_iq2_xxs_q8k_fast", 2) + proj.expert_bytes("ds4_moe_down_q2_k_fast", 1)
        self.assertEqual(fused, routed)
        self.assertEqual(proj.classify("ds4_moe_gate_up_iq2_xxs_q8k_fast"), 2)
        self.assertEqual(proj.classify("ds4_matvec_f16_router_fast"), 5)
        self.assertEqual(proj.classify("ds4_matvec_q8_0_swiglu_fast"), 0)
        self.assertEqual(proj.classify("ds4_matvec_q8_0_fast"), 1)
        self.assertEqual(proj.classify("ds4_matvec_f16_pair_fast"), 4)
        self.assertEqual(proj.classify("ds4_matvec_f16_fast"), 5)
        self.assertEqual(proj.classify("ds4_something_new"), len(proj.CLASSES) - 1)

    def test_projection_sums_bandwidth_and_launches(self):
        steps, rows = proj.parse_profile(PROFILE_LOG)
        out, total = proj.project(rows, steps, 212.0, 4.0, 2048, 4800.0)
        q8 = next(c for c in out if c["kernels"] == ["ds4_matvec_q8_0_fast"])
        self.assertAlmostEqual(q8["launches"], 259.0)
        self.assertAlmostEqual(q8["ms"], 2.0)
        self.assertAlmostEqual(q8["bw_ms"], q8["bytes"] / 212e6)
        self.assertAlmostEqual(q8["proj_ms"], q8["bw_ms"] + 259 * 4e-3)
        norm = next(c for c in out if c["kernels"] == ["ds4_rms_norm_quant"])
        self.assertEqual(norm["bytes"], 0)
        self.assertAlmostEqual(norm["proj_ms"], 0.1 + 216 * 4e-3)  # profiled time is the floor
        self.assertAlmostEqual(total["launches"], 259 + 43 + 43 + 216)
        self.assertAlmostEqual(total["tps"], 1e3 / sum(c["proj_ms"] for c in out))

    def test_verify_projection_scales_only_the_per_token_classes(self):
        steps, rows = proj.parse_profile(PROFILE_LOG)
        out, total = proj.project(rows, steps, 212.0, 4.0, 2048, 4800.0)
        extra = proj.VERIFY_EXTRA_LAUNCHES * 4e-3
        self.assertAlmostEqual(proj.verify_ms(out, 1, 212.0, 4.0), total["proj_ms"] + extra)
        experts = sum(c["bytes"] for c in out if c["class"].startswith("routed experts"))
        self.assertGreater(experts, 0)
        # Where the experts are bandwidth-bound, a second token adds exactly their bytes' time.
        bound = all(c["bytes"] / 212e6 >= c["ms"] for c in out if c["class"].startswith("routed experts"))
        if bound:
            delta = proj.verify_ms(out, 2, 212.0, 4.0) - proj.verify_ms(out, 1, 212.0, 4.0)
            self.assertAlmostEqual(delta, experts / 212e6)
        self.assertLess(proj.verify_ms(out, 2, 212.0, 4.0), 2 * total["proj_ms"])
        self.assertAlmostEqual(proj.tokens_per_cycle(0.5, 3), 1.75)
        self.assertEqual(proj.tokens_per_cycle(0.0, 6), 1.0)

    def test_dspark_pass_bytes_match_the_support_file(self):
        # model::dspark::tests::draft_pass_bytes_of_flash counts the same pass from the tensor table:
        # 3 x 143,105,496 dense + 84 x 7,077,888 experts + 53,493,760 main_proj + 175,992,756 heads
        # (5 Markov rows) + 562,626,560 LM head.
        self.assertEqual(proj.dspark_pass_bytes(), 1_815_972_156)
        # Cut at row 0: no Markov row, no LM head, the HC head and final norm only.
        self.assertEqual(proj.dspark_pass_bytes(28, 0, False), 3 * 143_105_496 + 84 * 7_077_888 + 53_493_760 + 147_476)

    def test_dspark_cycle_is_a_draft_pass_plus_a_verify(self):
        steps, rows = proj.parse_profile(PROFILE_LOG)
        out, total = proj.project(rows, steps, 212.0, 4.0, 2048, 4800.0)

        class A:
            bw, launch_us, draft_frac = 212.0, 4.0, None

        v1, v2 = proj.verify_ms(out, 1, 212.0, 4.0), proj.verify_ms(out, 2, 212.0, 4.0)
        c = proj.dspark_cycle(out, total, A, 0.83, 1.0, 5.0)
        self.assertAlmostEqual(c["verify_ms"], v2)
        self.assertAlmostEqual(c["cycle_ms"], 5.0 + v2)
        self.assertAlmostEqual(c["tps"], 1.83e3 / (5.0 + v2))
        self.assertAlmostEqual(c["x_plain"], c["tps"] / total["tps"])
        # A mean of half a draft a cycle: halfway between a block of 1 and a block of 2.
        self.assertAlmostEqual(proj.dspark_cycle(out, total, A, 0.4, 0.5, 0.0)["verify_ms"], (v1 + v2) / 2)
        # The projected pass: its bytes at 212 GB/s plus the floors and launches of 3 layers' share.
        d = proj.dspark_draft_ms(out, total, 212.0, 4.0, 1.0e9)
        floors = sum(max(0.0, c["ms"] - c["bw_ms"]) for c in out) * 3 / 43
        launches = total["launches"] * 3 / 43 + proj.DSPARK_HEAD_LAUNCHES
        self.assertAlmostEqual(d, 1e9 / 212e6 + floors + launches * 4e-3)
        A.draft_frac = 0.2
        table = proj.dspark_markdown(out, total, A)
        self.assertIn(f"draft pass: {0.2 * total['proj_ms']:.2f} ms = 0.200 of a decode step (--draft-frac 0.2)", table)
        self.assertEqual(len([l for l in table.splitlines() if l.startswith("| ds4 on gfx1151")]), 1)

    def test_committed_h200_profile(self):
        log = os.path.join(ROOT, "docs/benchmarks/2026-12-03-h200-decode-profile.txt")
        with open(log) as f:
            steps, rows = proj.parse_profile(f.read())
        self.assertEqual(steps, 64)
        self.assertEqual(len(rows), 26)
        self.assertEqual(rows[0], ("ds4_moe_gate_up_iq2_xxs_q8k_fast", 2752, 91.48))
        self.assertAlmostEqual(sum(ms for _, _, ms in rows), 670.76, delta=0.1)


if __name__ == "__main__":
    unittest.main()

//! The kernel table against the kernel sources, and the builders' arguments and grids.

use super::*;
use std::path::Path;

/// The kernel source files (kernels/*.hip and mathf.h, which holds a test kernel), sorted.
fn kernel_source_files() -> Vec<std::path::PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("kernels");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "hip") || p.ends_with("mathf.h"))
        .collect();
    files.sort();
    files
}

/// One `extern "C" __global__` kernel as its source declares it: (file name, kernel name,
/// [(param name, kind)]).
type SourceKernel = (String, String, Vec<(String, ArgKind)>);

/// Every kernel of kernels/*.hip (and mathf.h).
fn parse_kernel_sources() -> Vec<SourceKernel> {
    let mut out = Vec::new();
    for file in kernel_source_files() {
        let fname = file.file_name().unwrap().to_str().unwrap().to_string();
        let src = std::fs::read_to_string(&file).unwrap();
        let mut rest = src.as_str();
        while let Some(i) = rest.find("extern \"C\" __global__") {
            rest = &rest[i..];
            let v = rest.find(" void ").expect("void after extern C");
            let open = rest[v..].find('(').unwrap() + v;
            let name = rest[v + 6..open].trim().to_string();
            let close = rest[open..].find(')').unwrap() + open;
            let params = rest[open + 1..close]
                .split(',')
                .map(|p| {
                    let p = p.split_whitespace().collect::<Vec<_>>().join(" ");
                    let pname = p.rsplit([' ', '*']).next().unwrap().to_string();
                    let scalar = [("u32 ", ArgKind::U32), ("u64 ", ArgKind::U64), ("float ", ArgKind::F32)]
                        .into_iter()
                        .find(|(ty, _)| p.starts_with(ty));
                    let kind = match scalar {
                        _ if p.contains('*') => ArgKind::Ptr,
                        Some((_, kind)) => kind,
                        None => panic!("{}: {name}: unsupported parameter type in '{p}'", file.display()),
                    };
                    (pname, kind)
                })
                .collect();
            out.push((fname.clone(), name, params));
            rest = &rest[close..];
        }
    }
    out
}

#[test]
fn kernel_table_matches_sources() {
    let parsed = parse_kernel_sources();
    assert_eq!(parsed.len(), ALL_KERNELS.len(), "kernel count: sources vs ALL_KERNELS");
    for (file, name, params) in &parsed {
        let def = kernel_def(name).unwrap_or_else(|| panic!("{name} is in kernels/ but not in ALL_KERNELS"));
        assert_eq!(def.source, file, "{name}: ALL_KERNELS names the wrong source file");
        let ours: Vec<(String, ArgKind)> = def.params.iter().map(|p| (p.name.to_string(), p.kind)).collect();
        assert_eq!(&ours, params, "{name}: parameter list differs from the source");
    }
}

/// The text from `start` (at a `{`) to its matching `}`.
fn braced(src: &str, start: usize) -> &str {
    let mut depth = 0usize;
    for (i, ch) in src[start..].char_indices() {
        match ch {
            '{' => depth += 1,
            '}' => {
                depth -= 1;
                if depth == 0 {
                    return &src[start..=start + i];
                }
            }
            _ => {}
        }
    }
    panic!("unbalanced braces")
}

#[test]
fn every_kernel_awaits_its_predecessor() {
    // kernels/prelude.h ds4_grid_sync: an overlapped launch (kernel_module.rs launch_order) is only
    // correct when every kernel waits for the previous one, itself or in one of these helpers.
    const SYNCING_HELPERS: &[&str] = &["q8_tiled_product", "moe_gate_up_fast_body", "hc_pre_fast"];
    let sources: String = kernel_source_files()
        .iter()
        .map(|p| std::fs::read_to_string(p).unwrap())
        .collect();
    for helper in SYNCING_HELPERS {
        let def = format!(" {helper}(");
        let at = sources
            .match_indices(&def)
            .map(|(i, _)| i)
            .find(|&i| sources[..i].trim_end().ends_with("void"))
            .unwrap_or_else(|| panic!("no definition of {helper}"));
        let body = braced(&sources, at + sources[at..].find('{').unwrap());
        assert!(
            body.contains("ds4_grid_sync();"),
            "{helper} does not call ds4_grid_sync"
        );
    }
    let mut kernels = 0;
    for (i, _) in sources.match_indices("extern \"C\" __global__") {
        let open = i + sources[i..].find('{').unwrap();
        let v = i + sources[i..].find(" void ").unwrap() + 6;
        let name = &sources[v..v + sources[v..].find('(').unwrap()];
        let body = braced(&sources, open);
        assert!(
            body.contains("ds4_grid_sync();") || SYNCING_HELPERS.iter().any(|h| body.contains(&format!("{h}<"))),
            "{name} neither calls ds4_grid_sync nor a helper that does"
        );
        let waits_first = body[1..].trim_start().starts_with("ds4_grid_sync();");
        assert!(
            waits_first || PREFETCHING.contains(&name),
            "{name} does work before ds4_grid_sync: review that it reads only weights and stores nothing \
             global there, then list it in PREFETCHING"
        );
        assert!(
            !(waits_first && PREFETCHING.contains(&name)),
            "{name} waits first: take it off PREFETCHING"
        );
        kernels += 1;
    }
    assert_eq!(kernels, ALL_KERNELS.len());
}

/// The kernels that do something before `ds4_grid_sync` (themselves or in a `SYNCING_HELPERS` call),
/// each reviewed to read only weights and store nothing global there (kernels/README.md "Dependent
/// launches"); every other kernel waits first.
const PREFETCHING: &[&str] = &[
    // hc_pre_fast: the mix row, the norm weights and the split constants.
    "ds4_hc_pre_fused_fast",
    "ds4_hc_post_pre_fast",
    "ds4_hc_pre_token_fast",
    "ds4_hc_post_pre_token_fast",
    // q8_tiled_product (and the shared expert's twin of it): the first round's weight tiles.
    "ds4_matvec_q8_0_fast",
    "ds4_matvec_q8_0_q8_fast",
    "ds4_matvec_q8_0_normed_fast",
    "ds4_matvec_q8_0_pair_fast",
    "ds4_matvec_q8_0_swiglu_fast",
    "ds4_matvec_q8_0_normed_rows_fast",
    "ds4_matvec_q8_0_swiglu_q8_fast",
    // f16_row_first: the first step's F16 words.
    "ds4_matvec_f16_fast",
    "ds4_matvec_f16_normed_hadamard_fast",
    "ds4_matvec_f16_pair_fast",
    "ds4_matvec_f16_router_fast",
    // Their column forms (kernels/matvec_cols_fast.hip): the same loads before the wait.
    "ds4_matvec_q8_0_cols_fast",
    "ds4_matvec_q8_0_q8_cols_fast",
    "ds4_matvec_q8_0_pair_cols_fast",
    "ds4_matvec_q8_0_swiglu_cols_fast",
    "ds4_matvec_f16_cols_fast",
    "ds4_matvec_f16_pair_cols_fast",
    // moe_gate_up_fast_body: the IQ2_XXS grid into shared memory.
    "ds4_moe_gate_up_iq2_xxs_fast",
    "ds4_moe_gate_up_iq2_xxs_q8k_fast",
    "ds4_moe_gate_up_q2_k_fast",
    "ds4_moe_gate_up_q2_k_q8k_fast",
    "ds4_moe_gate_up_q4_k_fast",
    "ds4_moe_gate_up_q4_k_q8k_fast",
];

#[test]
fn every_kernel_is_included_by_the_translation_unit() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("kernels");
    let tu = std::fs::read_to_string(root.join("ds4.hip")).unwrap();
    for e in std::fs::read_dir(&root).unwrap() {
        let p = e.unwrap().path();
        let fname = p.file_name().unwrap().to_str().unwrap().to_string();
        if fname.ends_with(".hip") && fname != "ds4.hip" {
            assert!(
                tu.contains(&format!("#include \"{fname}\"")),
                "kernels/ds4.hip does not include {fname}"
            );
        }
    }
}

#[test]
fn iq2_grid_header_matches_rust_table() {
    let h = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("kernels/iq2xxs_grid.h")).unwrap();
    let vals: Vec<u64> = h
        .split(|c: char| !c.is_ascii_alphanumeric())
        .filter_map(|w| w.strip_prefix("0x")?.strip_suffix("ull"))
        .map(|w| u64::from_str_radix(w, 16).unwrap())
        .collect();
    assert_eq!(vals.as_slice(), &crate::gguf::iq2_tables::IQ2XXS_GRID[..]);
}

#[test]
fn packed_arguments_are_little_endian_slots() {
    let l = fill_f32(0x1234_5678_9abc, 1000, -1.0e30);
    let mut p = l.packed();
    assert_eq!(p.slots(), &[0x1234_5678_9abc, 1000, (-1.0e30f32).to_bits() as u64]);
    let ptrs = p.pointers();
    // SAFETY: each pointer addresses one live u64 slot of `p`.
    let third = unsafe { *(ptrs[2] as *const f32) };
    assert_eq!(third, -1.0e30);
    assert_eq!(l.grid, [4, 1, 1]);
}

/// Attention inputs at device addresses 4.. with 1000 compressed rows.
fn attention_inputs() -> AttentionInputs {
    AttentionInputs {
        q: 4,
        ring: 5,
        comp: 6,
        comp_sel: 7,
        sinks: 8,
        pos: 9,
        n_comp_avail: 1000,
    }
}

#[test]
fn builders_cover_every_kernel_with_matching_arguments() {
    // Launch::new asserts count and kinds; here every builder is called once with Flash shapes.
    let rope = RopeParams::yarn(64, 160000.0, 16.0, 65536, 32.0, 1.0);
    let shape = AttentionShape::flash_ratio4();
    let io = attention_inputs();
    let att = attention(&shape, 1, 2, 3, &io, 640, 1);
    let topk = IndexerTopk {
        sel: 1,
        scores: 2,
        pos: 3,
        score_stride: 1024,
        n_comp_avail: 1000,
        ratio: 4,
        top_k: 512,
    };
    let q8k = Q8K { q: 1, d: 2, bsums: 3 };
    let x8 = Q8Act { q: 3, d: 4 };
    let mixed = HcMixed {
        mix: 3,
        hc: 4,
        scale: 5,
        base: 6,
        n_embd: 4096,
        n_hc: 4,
    };
    let proj = Q8Proj::plain(1, 2, x8, 4096, 1024);
    let swiglu = Q8Swiglu {
        mid: 1,
        wg: 2,
        wu: 3,
        x: x8,
        n_in: 4096,
        n_ff: 2048,
        limit: 10.0,
    };
    let hc_pre = flash_hc_pre_fused(1);
    let mut launches = vec![
        embed_hc(1, 2, 3, 4096, 4, 129280, 1),
        fill_f32(1, 10, 0.0),
        copy_spans(1, 2),
        rms_norm_quant(QuantOut::default(), 16, 0, 4096, 4096, 1, NQ_NORM, 1e-6),
        matvec_q8_0(&proj, 1),
        matvec_q8_0_swiglu(&swiglu, 1),
        matvec_f16(1, 2, 3, 4096, 256, 4096, 1),
        matvec_f16_pair(1, 2, 3, 4, 5, 4096, 1024, 4096, 1),
        router(1, 2, 3, 0, 0, 4, 256, 6, 1.5, 1),
        hc_mix(16, 32, 48, 16384, 24, 1e-6, 1), // aligned: its fast twin too
        hc_pre_finish(1, 2, &mixed, 20, 1e-6, 1),
        hc_head_finish(1, &mixed, 1e-6, 1),
        hc_pre.clone(),
        hc_post(1, 1, 2, 0, 3, 4096, 4, 1),
        // 16-byte aligned pointers: the fast twins' vector accesses need them (`fast_twin`).
        rows_finish(
            16,
            32,
            48,
            64,
            1,
            512,
            row_flags::NORM | row_flags::ROPE,
            2304,
            rope,
            1e-6,
            1,
        ),
        rows_finish_emitted(1, 2, 3, 512, row_flags::NORM, 4, 1026, rope, 1e-6, 1, 1),
        // The indexer's query heads (their twin: ds4_rows_finish_hadamard_fast).
        rows_finish(
            1,
            NULL,
            NULL,
            2,
            64,
            128,
            row_flags::ROPE | row_flags::HADAMARD_FP4,
            1,
            rope,
            1e-6,
            1,
        ),
        compressor_pool(1, 2, 3, 4, 5, 6, 7, 512, 4, 1, 1026),
        // 16-byte aligned (the fast twins' float4 queries): one token, and a batch (128-row twin).
        indexer_scores(16, 32, 48, 64, 80, 64, 1000, 4, 512, 1024, 0.011, 1000, 1),
        indexer_scores(16, 32, 48, 64, 80, 64, 1000, 4, 512, 1024, 0.011, 1000, 64),
        indexer_topk(&topk, 1),
        argmax(1, 2, 129280),
        sample_min_p(1, 2, 129280, 1.0, 0.05, 0.5),
    ];
    launches.extend(att);
    for fmt in ExpertFormat::ALL {
        launches.push(moe_gate_up(fmt, 1, 2, 3, q8k, 4, 5, 4096, 2048, 6, 10.0, 1));
        launches.push(moe_down(fmt, 1, 2, q8k, 4, 2048, 4096, 6, 1));
        launches.push(matvec_k(fmt, 1, 2, q8k, 4096, 4096, 1));
        let t = ExpertTiles {
            pairs: 1,
            tiles: 2,
            n_tiles: 3,
            max_tiles: moe_max_tiles(2048, 6, 256),
        };
        launches.push(moe_gemm_gate_up(fmt, 1, 2, 3, q8k, t, 4, 4096, 2048, 6, 10.0));
        launches.push(moe_gemm_down(fmt, 1, 2, q8k, t, 2048, 4096, 6));
    }
    launches.push(gemm_q8_0(&proj, 2048));
    launches.push(gemm_q8_0_swiglu(&swiglu, 2048));
    launches.push(moe_group(1, 2, 3, 4, 2048, 6, 256, MOE_MIN_COLS));
    launches.push(moe_sum(1, 2, 4096, 6, 2048));
    launches.push(gemm_f16(1, 2, 3, 4096, 1024, 4096, 2048));
    launches.push(test_mathf(1, 2, 1000, MathFn::Sin));
    // Fast-mode sequences built by the attention sublayer (not one-for-one twins).
    let plan = AttentionSplitPlan {
        n_split: 20,
        most_slices: 64,
        min_rows: ATTENTION_SPLIT_ROWS,
        matrix_cores: false,
    };
    let io = AttentionInputs {
        n_comp_avail: 512,
        ..io
    };
    launches.extend(attention_decode_split(&shape, plan, 1, 2, &io, 1));
    let on_mma = AttentionSplitPlan {
        matrix_cores: true,
        min_rows: ATTENTION_SPLIT_MMA_ROWS,
        ..plan
    };
    launches.extend(attention_decode_split(&shape, on_mma, 1, 2, &io, 1));
    let rope = RopeParams::plain(64, 10000.0);
    launches.extend(attention_decode_split_q8(&shape, plan, rope, (1, 3), 2, &io, 1).expect("whole Q8_0 blocks"));
    let topk = IndexerTopk {
        score_stride: 16384,
        n_comp_avail: 16384,
        ..topk
    };
    launches.extend(indexer_topk_segmented(&topk, INDEXER_TOPK_SEGMENT, 16384, 1).unwrap());
    // The fast-mode fusion of an HC post into the next HC pre (state at the pre's `hc`, 64).
    launches.extend(fused_hc_post_pre(&hc_post(64, 64, 144, 0, 160, 4096, 4, 1), &hc_pre));
    // A prefill batch's HC steps: one block per token (`hc_layout`), pre alone and fused.
    let batch_pre = flash_hc_pre_fused(2048);
    launches.push(batch_pre.clone());
    launches.extend(fused_hc_post_pre(
        &hc_post(64, 64, 144, 0, 160, 4096, 4, 2048),
        &batch_pre,
    ));
    // A routed down projection small enough for the fast Q4_K twin (4 rows of 1152 bytes).
    launches.push(moe_down(ExpertFormat::Q4K, 1, 2, q8k, 4, 2048, 4096, 4, 1));
    // The batch's attention in one launch (fast mode, `Pass::attention_prefill_fast`), its pointers
    // 16-byte aligned.
    let aligned = AttentionInputs {
        q: 32,
        ring: 48,
        comp: 64,
        comp_sel: 80,
        sinks: 96,
        pos: 112,
        n_comp_avail: 512,
    };
    launches.push(attention_prefill_fast(&shape, 16, &aligned, 37));
    // The fast-mode fusion of two matvecs of one input.
    let at = |p: DevPtr| Q8Proj::plain(p, p + 16, Q8Act { q: 64, d: 80 }, 4096, 1024);
    launches.extend(paired_matvec_q8_0(&at(112), &at(160), 1, FastGrids::default()));
    launches.extend(matvec_q8_0_quantized(&at(112), (16, 32), 1, FastGrids::default()));
    // A verify block's column products (their fast twins too) and fusions.
    launches.push(matvec_q8_0_cols(&proj, 6));
    launches.push(matvec_q8_0_swiglu_cols(&swiglu, 6));
    launches.push(matvec_f16_cols(16, 32, 48, 4096, 256, 4096, 6));
    launches.push(matvec_f16_pair_cols(16, 32, 48, 64, 80, 4096, 1024, 4096, 6));
    launches.extend(paired_matvec_q8_0_cols(&at(112), &at(160), 6, FastGrids::default()));
    launches.extend(matvec_q8_0_quantized_cols(&at(112), (16, 32), 6, FastGrids::default()));
    // ... of a row norm and the projection of its planes (the query's up-projection).
    let q_b = Q8Proj::plain(112, 128, Q8Act { q: 64, d: 80 }, 1024, 32768);
    launches.extend(matvec_q8_0_normed(&q_b, 144, 160, 1e-6, 1, FastGrids::default()));
    // ... of a routed gate/up and the quantization of its output.
    let x = Q8K {
        q: 16,
        d: 32,
        bsums: 48,
    };
    for fmt in ExpertFormat::ALL {
        let gate_up = moe_gate_up(fmt, 16, 32, 48, x, 64, 80, 4096, 2048, 6, 7.0, 1);
        let planes = QuantOut {
            q8_k_q: 96,
            q8_k_d: 112,
            q8_k_bs: 128,
            ..Default::default()
        };
        launches.extend(moe_gate_up_quantized(
            &gate_up,
            &quantize_rows(planes, 16, 2048, 6),
            144,
            FastGrids::default(),
        ));
    }
    // ... of the router's logits and selection.
    let logits = matvec_f16(16, 32, 48, 4096, 256, 4096, 1);
    launches.extend(matvec_f16_router(
        &logits,
        &router(64, 80, 16, 0, 0, 96, 256, 6, 1.5, 1),
        112,
    ));
    // ... and of two row finishes of the same tokens.
    let rope = RopeParams::from_rope(&crate::backend::cpu::ops::Rope::for_layer(
        &crate::model::hparams::HParams::flash(),
        true,
    ));
    let q_rows = rows_finish(64, NULL, NULL, 80, 64, 512, row_flags::NORM, 1, rope, 1e-6, 1);
    let kv_rows = rows_finish(
        96,
        112,
        128,
        80,
        1,
        512,
        row_flags::NORM | row_flags::STORE_RING,
        2175,
        rope,
        1e-6,
        1,
    );
    launches.extend(fused_rows_finish_pair(&q_rows, &kv_rows));
    // ... products that finish their heads: the query's (its heads at the up-projection's output)
    // and the indexer's (norm, F16 heads, Hadamard rows).
    let q_heads = rows_finish(112, NULL, NULL, 80, 64, 512, row_flags::NORM, 1, rope, 1e-6, 1);
    let pair = fused_rows_finish_pair(&q_heads, &kv_rows).expect("paired");
    let normed = matvec_q8_0_normed(&q_b, 144, 160, 1e-6, 1, FastGrids::default()).expect("normed");
    launches.extend(matvec_q8_0_normed_rows(&normed, &pair, 176));
    let norm = norm_rows(
        QuantOut {
            out: 16,
            ..Default::default()
        },
        32,
        48,
        1024,
        1,
        1e-6,
    );
    let qi = matvec_f16(64, 80, 16, 1024, 64 * 128, 1024, 1);
    let qi_flags = row_flags::ROPE | row_flags::HADAMARD_FP4;
    let qi_rows = rows_finish(64, NULL, NULL, 96, 64, 128, qi_flags, 1, rope, 1e-6, 1);
    launches.extend(matvec_f16_normed_hadamard(&norm, &qi, &qi_rows, 112));
    // ... and the shared expert's SwiGLU with the Q8_0 of its output.
    let shared = Q8Swiglu {
        mid: 16,
        wg: 32,
        wu: 48,
        x: Q8Act { q: 64, d: 80 },
        n_in: 4096,
        n_ff: 2048,
        limit: 7.0,
    };
    let planes = QuantOut::q8_0(96, 112);
    launches.extend(matvec_q8_0_swiglu_quantized(
        &matvec_q8_0_swiglu(&shared, 1),
        &quantize_rows(planes, 16, 2048, 1),
        128,
    ));
    // ... and the min-p draw's two launches (not twins: two launches for one).
    launches.extend(sample_min_p_fast(16, 32, 129_280, 0.8, 0.05, 0.5));
    // The fast-arithmetic twins take their exact launch's arguments (`fast_twin`).
    let twins: Vec<Launch> = launches.iter().filter_map(fast_twin).collect();
    launches.extend(twins);
    let mut names: Vec<&str> = launches.iter().map(|l| l.kernel.name).collect();
    names.sort();
    names.dedup();
    let mut all: Vec<&str> = ALL_KERNELS.iter().map(|k| k.name).collect();
    all.sort();
    assert_eq!(
        names, all,
        "a kernel without a builder (or a builder for an unknown kernel)"
    );
}

#[test]
fn launch_grids_for_flash_decode() {
    // 1024 q_a rows, 8 per block.
    let x8 = Q8Act { q: 3, d: 4 };
    assert_eq!(matvec_q8_0(&Q8Proj::plain(1, 2, x8, 4096, 1024), 1).grid, [128, 1, 1]);
    // LM head: 129280 rows -> 16160 blocks.
    assert_eq!(
        matvec_q8_0(&Q8Proj::plain(1, 2, x8, 4096, 129280), 1).grid,
        [16160, 1, 1]
    );
    // 6 experts x 2048 rows for 2 tokens.
    let l = moe_gate_up(ExpertFormat::Q4K, 1, 2, 3, Q8K::default(), 4, 5, 4096, 2048, 6, 10.0, 2);
    assert_eq!(l.grid, [256, 6, 2]);
    assert_eq!(hc_mix(1, 2, 3, 16384, 24, 1e-6, 1).grid, [24, 1, 1]);
    // Prefill: 2048 tokens x 6 slots = 192 full tiles + at most one partial tile per expert.
    assert_eq!(moe_max_tiles(2048, 6, 256), 192 + 256);
    assert_eq!(
        gemm_q8_0(&Q8Proj::plain(1, 2, x8, 1024, 32768), 2048).grid,
        [512, 32, 1]
    );
}

#[test]
fn hadamard_rows_twin() {
    let rope = RopeParams::from_rope(&crate::backend::cpu::ops::Rope::for_layer(
        &crate::model::hparams::HParams::flash(),
        true,
    ));
    let had = row_flags::ROPE | row_flags::HADAMARD_FP4;
    // 64 query heads of 128: 8 blocks of 8 rows; compressed rows: one block a row.
    let heads = fast_twin(&rows_finish(1, NULL, NULL, 2, 64, 128, had, 1, rope, 1e-6, 1)).expect("a twin");
    assert_eq!(
        (heads.kernel.name, heads.grid),
        ("ds4_rows_finish_hadamard_fast", [8, 1, 1])
    );
    let comp = rows_finish_emitted(
        1,
        2,
        3,
        128,
        row_flags::NORM | had | row_flags::ROUND_F16,
        4,
        1026,
        rope,
        1e-6,
        2,
        1,
    );
    assert_eq!(fast_twin(&comp).expect("a twin").grid, [1, 1, 1]);
    // Other widths, and the E4M3 flag, keep the exact kernel.
    assert!(fast_twin(&rows_finish(1, NULL, NULL, 2, 64, 256, had, 1, rope, 1e-6, 1)).is_none());
    assert!(
        fast_twin(&rows_finish(
            1,
            NULL,
            NULL,
            2,
            64,
            128,
            had | row_flags::E4M3,
            1,
            rope,
            1e-6,
            1
        ))
        .is_none()
    );
}

#[test]
fn attention_visibility_and_grids() {
    let s = AttentionShape::flash_ratio4();
    // p = 2: 3 raw rows, no compressed row yet (first one at p = 3).
    assert_eq!(s.visible_rows(2, 0, false), 3);
    // p = 3: 4 raw + 1 compressed.
    assert_eq!(s.visible_rows(3, 1, false), 5);
    // p = 4000: 128 raw + min(1000, 1000) compressed, or 512 with the indexer selection.
    assert_eq!(s.visible_rows(4000, 1000, false), 1128);
    assert_eq!(s.visible_rows(4000, 1000, true), 640);
    // Scores of a decode step over 640 rows; the score grid has a block per 8 rows.
    assert_eq!(s.score_floats(1, 640), 64 * 640);
    let [scores, softmax, values] = attention(&s, 1, 2, 3, &attention_inputs(), 640, 1);
    assert_eq!(
        (scores.grid, softmax.grid, values.grid),
        ([80, 1, 1], [64, 1, 1], [8, 8, 1])
    );
}

#[test]
fn compressor_emission_rows() {
    // Decode at p = 3 (ratio 4) emits row 0; p = 4 emits nothing.
    assert_eq!(compressor_emitted(4, 3, 1), (0, 1));
    assert_eq!(compressor_emitted(4, 4, 1).1, 0);
    // A 2048-token chunk from 0 emits rows 0..511 (ratio 4) and 0..15 (ratio 128).
    assert_eq!(compressor_emitted(4, 0, 2048), (0, 512));
    assert_eq!(compressor_emitted(128, 0, 2048), (0, 16));
    // Chunk 100..300 at ratio 128: p = 127 and 255 emit rows 0 and 1.
    assert_eq!(compressor_emitted(128, 100, 200), (0, 2));
    // The most rows a batch emits bounds every position's count (the emitted-rows grid).
    for (ratio, n) in [(4u32, 1u32), (4, 3), (4, 4), (4, 5), (128, 1), (128, 200), (128, 256)] {
        let most = (0..600).map(|p| compressor_emitted(ratio, p, n).1).max().unwrap();
        assert_eq!(compressor_max_emitted(ratio, n), most, "ratio {ratio}, {n} tokens");
    }
}

#[test]
fn yarn_parameters_for_flash() {
    // docs/model.md#rope-and-yarn: corr dims 15.453 / 24.708 -> low 15, high 25 for Flash.
    let r = RopeParams::yarn(64, 160000.0, 16.0, 65536, 32.0, 1.0);
    assert_eq!((r.corr_low, r.corr_high), (15.0, 25.0));
    assert_eq!(r.freq_scale, 1.0 / 16.0);
    assert!((r.theta_scale - 160000f32.powf(-1.0 / 32.0)).abs() < 1e-9);
    assert_eq!(RopeParams::plain(64, 10000.0).ext_factor, 0.0);
}

#[test]
fn device_rope_is_the_cpu_engines() {
    use crate::backend::cpu::ops::Rope;
    use crate::model::hparams::HParams;
    let hp = HParams::flash();
    let yarn = RopeParams::yarn(64, 160000.0, 16.0, 65536, 32.0, 1.0);
    assert_eq!(RopeParams::from_rope(&Rope::for_layer(&hp, true)), yarn);
    assert_eq!(
        RopeParams::from_rope(&Rope::for_layer(&hp, false)),
        RopeParams::plain(hp.n_rot as u32, hp.rope_freq_base)
    );
}

#[test]
fn a_missing_target_names_the_built_ones_and_the_fix() {
    let e = embedded_code_object("gfx9999").unwrap_err();
    assert!(
        e.contains("no GPU kernels for gfx9999") && e.contains("DS4_HIP_ARCHS=gfx9999"),
        "{e}"
    );
}

/// A Flash-shaped `ds4_hc_pre_fused` launch (n_embd 4096, 4 streams, 20 Sinkhorn iterations) for
/// `n_tok` tokens whose pointers are 16-byte aligned, as its fast twin requires (`fast_twin`); `hc`
/// is 64.
pub(super) fn flash_hc_pre_fused(n_tok: u32) -> Launch {
    let eps = HcEps {
        rms: 1e-6,
        hc: 1e-6,
        norm: 1e-6,
    };
    hc_pre_fused(
        16,
        QuantOut::default(),
        32,
        48,
        64,
        80,
        96,
        112,
        128,
        4096,
        4,
        20,
        eps,
        n_tok,
    )
}

#[test]
fn a_launch_shape_names_its_grid_and_integer_arguments() {
    let p = Q8Proj::plain(16, 32, Q8Act { q: 48, d: 64 }, 1024, 32768);
    let l = matvec_q8_0(&p, 1);
    assert_eq!(
        l.shape(),
        format!(
            " grid {}x1x1 n_in=1024 n_out=32768 rows_per_group=32768 x_stride=1024",
            32768 / MATVEC_ROWS
        )
    );
}

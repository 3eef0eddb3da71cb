//! Checks that only the emulator can run: `ds4_emutest_block_dot_f16_seq`, the emulator-only entry of
//! kernels/matvec.hip that exposes the F16 matvec's sequential block dot (not a kernel of the GPU
//! code objects), bitwise against `quant::dot_f16` on the same scaled activations.

use ds4_chat::backend::cpu::quant::dot_f16;
use ds4_chat::backend::hip::runtime::{KernelArgs, LaunchDims};
use ds4_chat::gguf::half::f32_to_f16;

use super::support::*;

#[test]
fn block_dot_f16_seq_is_the_sequential_reference() {
    if super::on_device() {
        return;
    }
    let Some(gpu) = super::open_gpu() else { return };
    // The emulator's modules hold every entry it registers, whatever the image.
    let module = gpu.ctx.load_module(&[0u8; 8]).expect("emulator module");
    let f = module
        .function("ds4_emutest_block_dot_f16_seq")
        .expect("the emulator registers ds4_emutest_block_dot_f16_seq");
    let mut rng = CheckRng::new(41);
    for (n, scale) in [(16384usize, 0.37f32), (2056, 1.0), (8, 3.5)] {
        let rows = 2;
        let w: Vec<u16> = random_vec(&mut rng, rows * n, 0.5)
            .into_iter()
            .map(f32_to_f16)
            .collect();
        let wb: Vec<u8> = w.iter().flat_map(|h| h.to_le_bytes()).collect();
        let x = random_vec(&mut rng, n, 2.0);
        let flat: Vec<f32> = x.iter().map(|&v| v * scale).collect();
        let want: Vec<f32> = (0..rows)
            .map(|r| dot_f16(&wb[r * 2 * n..(r + 1) * 2 * n], &flat))
            .collect();
        let (w_d, x_d, y) = (
            gpu.up(&w).unwrap(),
            gpu.up(&x).unwrap(),
            gpu.poisoned::<f32>(rows).unwrap(),
        );
        let mut args = KernelArgs::new();
        args.push(y.ptr())
            .push(w_d.ptr())
            .push(x_d.ptr())
            .push(scale)
            .push(n as u32);
        let dims = LaunchDims {
            grid: [rows as u32, 1, 1],
            block: [256, 1, 1],
            shared_bytes: 0,
        };
        // SAFETY: the argument list matches the entry's (y, w, x, x_scale, n); buffers hold rows × n.
        unsafe { f.launch(&gpu.stream, dims, &mut args).unwrap() };
        gpu.stream.synchronize().unwrap();
        let r = same_bits(
            &format!("block_dot_f16_seq[n {n}]"),
            &y.to_vec::<f32>().unwrap(),
            &want,
            String::new(),
        );
        assert_eq!(r.verdict, Verdict::Pass, "{}: {}", r.name, r.note);
    }
}

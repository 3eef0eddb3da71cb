//! `ds4-chat selftest --backend hip [--model FILE [--forward N [--exact]]]`: checks the GPU's HIP runtime, the
//! kernel module and (with a model) weight placement, one line per check (PASS/FAIL/SKIP); with
//! `--forward N` the device forward pass against the CPU engine on the model. Fails (non-zero exit)
//! if any check fails. Every kernel against the CPU reference is the test suite tests/hip_kernels.
//!
//! Owns argument parsing and printing only; the checks are `backend::hip::selftest` and
//! `cli::selftest::forward`.

#[cfg(feature = "hip")]
mod forward;

use super::CliResult;

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Backend to check against the CPU reference (only `hip` has device checks).
    #[arg(long, default_value = "hip")]
    pub backend: String,
    /// Seed of the random inputs.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Also upload this model's weights to the device and read them back.
    #[arg(long)]
    pub model: Option<std::path::PathBuf>,
    /// Run the device forward pass against the CPU engine on --model: N prompt tokens, then a greedy
    /// continuation of --greedy tokens (only this check runs).
    #[arg(long, value_name = "N")]
    pub forward: Option<usize>,
    /// Greedy continuation length of --forward.
    #[arg(long, default_value_t = 32)]
    pub greedy: usize,
    #[command(flatten)]
    pub arithmetic: super::ArithmeticArgs,
}

pub fn run(args: Args) -> CliResult {
    match args.backend.as_str() {
        "hip" => run_hip(&args),
        "cpu" => Err("selftest: the CPU backend is the reference; use --backend hip".into()),
        other => Err(format!("selftest: unknown backend '{other}' (expected 'hip')")),
    }
}

#[cfg(not(feature = "hip"))]
fn run_hip(_args: &Args) -> CliResult {
    Err("selftest --backend hip: this binary was built without the `hip` feature (cargo build --features hip)".into())
}

#[cfg(feature = "hip")]
fn run_hip(args: &Args) -> CliResult {
    use crate::backend::hip::HipContext;
    use crate::backend::hip::selftest::{self, CheckOptions, CheckResult, Verdict};

    let ctx = HipContext::new().map_err(|e| format!("selftest: {e}"))?;
    println!("selftest: {}", ctx.info().summary());
    let model = match &args.model {
        Some(path) => Some(std::sync::Arc::new(
            crate::model::Model::open(path).map_err(|e| format!("selftest: {e}"))?,
        )),
        None => None,
    };
    if let Some(n) = args.forward {
        let model = model.ok_or("selftest --forward needs --model FILE")?;
        drop(ctx);
        let ok = forward::run_forward_check(
            model,
            n.max(1),
            args.greedy,
            args.seed,
            args.arithmetic.arithmetic(),
            &mut |l| println!("{l}"),
        )
        .map_err(|e| format!("selftest --forward: {e}"))?;
        return if ok {
            Ok(())
        } else {
            Err("selftest --forward: the device forward pass differs from the CPU engine".into())
        };
    }
    let opts = CheckOptions { seed: args.seed, model };
    let print = |r: &CheckResult| println!("{r}");
    let results = selftest::run_all(&ctx, &opts, &mut { print });
    let failed = results.iter().filter(|r| r.verdict == Verdict::Fail).count();
    let skipped = results.iter().filter(|r| matches!(r.verdict, Verdict::Skip(_))).count();
    println!(
        "selftest: {} checks, {} passed, {failed} failed, {skipped} skipped",
        results.len(),
        results.len() - failed - skipped
    );
    if failed > 0 {
        Err(format!("selftest: {failed} check(s) failed"))
    } else {
        Ok(())
    }
}

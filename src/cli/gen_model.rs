//! `ds4-chat gen-model`: write a synthetic ds4-layout GGUF with deterministic random weights
//! (`genmodel`), streamed to disk from several threads with a progress line on stderr.

use std::io::Write;
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::Instant;

use super::CliResult;
use crate::genmodel::{ExpertMix, GenSpec, Preset, SyntheticModel};

#[derive(clap::ValueEnum, Clone, Copy, Debug)]
pub enum PresetArg {
    /// The tiny model (docs/model.md#tiny-model) with the real vocabulary (~110 MB).
    Tiny,
    /// The real DeepSeek V4 Flash shapes (80.76 GiB with q2 experts).
    Flash,
    /// The smallest file the loader binds (one layer, no tokenizer; fuzzing and tests).
    Micro,
    /// A DSpark support file (docs/dspark.md#support-file) whose shapes match the model given with
    /// --like (5.58 GiB for the Flash shapes).
    Dspark,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug)]
pub enum ExpertsArg {
    /// IQ2_XXS gate/up + Q2_K down (the shipped q2 file).
    Q2,
    /// Q4_K experts (the shipped q4 file).
    Q4,
    /// Q4_K experts on the last third of the layers, q2 elsewhere.
    Mixed,
}

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Model shape.
    #[arg(long, value_enum, default_value = "tiny")]
    pub preset: PresetArg,
    /// Seed of the deterministic weights (same seed, same bytes).
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Output file.
    #[arg(long)]
    pub out: PathBuf,
    /// Routed-expert quantization.
    #[arg(long, value_enum, default_value = "q2")]
    pub experts: ExpertsArg,
    /// Writer threads (0 = one per core).
    #[arg(long, default_value_t = 0)]
    pub threads: usize,
    /// Keep only the preset's first N layers (the same per-layer shapes in a smaller file: the
    /// Flash shapes with 24 layers are about 46 GiB; with --experts mixed, Q4_K is the cut file's
    /// last third). ds4 loads only the full 43-layer layout.
    #[arg(long)]
    pub layers: Option<usize>,
    /// The main model a `--preset dspark` support file drafts for (its shapes are read from it).
    #[arg(long, value_name = "MODEL.gguf")]
    pub like: Option<PathBuf>,
}

/// A throttled one-line progress display on stderr: bytes, GiB/s, ETA.
struct Progress {
    total: u64,
    start: Instant,
    last: Mutex<Instant>,
}

const GIB: f64 = (1u64 << 30) as f64;

impl Progress {
    fn update(&self, done: u64) {
        let now = Instant::now();
        let Ok(mut last) = self.last.try_lock() else { return };
        if now.duration_since(*last).as_secs_f64() < 0.25 && done < self.total {
            return;
        }
        *last = now;
        let secs = now.duration_since(self.start).as_secs_f64().max(1e-9);
        let rate = done as f64 / secs;
        let eta = if rate > 0.0 {
            (self.total - done.min(self.total)) as f64 / rate
        } else {
            0.0
        };
        eprint!(
            "\r  {:8.2} / {:.2} GiB  {:6.2} GiB/s  ETA {:5.0} s ",
            done as f64 / GIB,
            self.total as f64 / GIB,
            rate / GIB,
            eta
        );
        let _ = std::io::stderr().flush();
    }
}

/// `--preset dspark`: a support file for the model of `--like`.
fn support_file(args: &Args) -> Result<(SyntheticModel, String), String> {
    let Some(like) = &args.like else {
        return Err("--preset dspark needs --like MODEL.gguf (the model it drafts for)".into());
    };
    let file = crate::gguf::GgufFile::open(like).map_err(|e| e.to_string())?;
    let hp = crate::model::HParams::from_gguf(&file).map_err(|e| e.in_file(like).to_string())?;
    let meta = crate::genmodel::dspark::meta_for(&hp);
    let m = crate::genmodel::dspark::support_model(&hp, &meta, args.seed).map_err(|e| e.to_string())?;
    Ok((m, format!("DSpark support for {}", like.display())))
}

pub fn run(args: Args) -> CliResult {
    if matches!(args.preset, PresetArg::Dspark) {
        let (model, what) = support_file(&args)?;
        return write(&model, &args, &what);
    }
    if args.like.is_some() {
        return Err("--like is for --preset dspark".into());
    }
    let preset = match args.preset {
        PresetArg::Tiny => Preset::Tiny,
        PresetArg::Flash => Preset::Flash,
        PresetArg::Micro => Preset::Micro,
        PresetArg::Dspark => unreachable!("handled above"),
    };
    let experts = match args.experts {
        ExpertsArg::Q2 => ExpertMix::Q2,
        ExpertsArg::Q4 => ExpertMix::Q4,
        ExpertsArg::Mixed => ExpertMix::Mixed,
    };
    let mut spec = GenSpec::new(preset, args.seed, experts);
    if let Some(n) = args.layers {
        spec = spec.with_layers(n)?;
    }
    let model = SyntheticModel::new(&spec).map_err(|e| e.to_string())?;
    let what = format!("{} preset, {} experts", preset.name(), experts.name());
    write(&model, &args, &what)
}

/// Stream `model` to `--out` with a progress line.
fn write(model: &SyntheticModel, args: &Args, what: &str) -> CliResult {
    let lay = &model.layout;
    eprintln!(
        "writing {} ({what}, seed {}): {} tensors, {:.2} GiB",
        args.out.display(),
        args.seed,
        lay.tensors.len(),
        lay.file_size as f64 / GIB
    );
    let start = Instant::now();
    let progress = Progress {
        total: lay.header.len() as u64 + lay.tensor_bytes(),
        start,
        last: Mutex::new(start),
    };
    model
        .write_file(&args.out, args.threads, |d| progress.update(d))
        .map_err(|e| e.to_string())?;
    let secs = start.elapsed().as_secs_f64();
    eprintln!();
    println!(
        "wrote {}: {} tensors, {} bytes ({:.2} GiB) in {:.1} s ({:.2} GiB/s)",
        args.out.display(),
        lay.tensors.len(),
        lay.file_size,
        lay.file_size as f64 / GIB,
        secs,
        lay.file_size as f64 / GIB / secs.max(1e-9)
    );
    Ok(())
}

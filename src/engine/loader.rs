//! The application's model loader: opens a GGUF file (or generates the in-memory demo model), checks
//! memory before anything large is allocated (memguard.rs), creates the backend and the chat text,
//! and hands the worker the mapping to warm up and probe.
//!
//! Owns the choice of backend for a `LoadRequest`. GPU backends hook in here (feature `hip`). Must
//! not run turns (worker.rs) or compute kernels.

use std::sync::Arc;

use crate::backend::Backend;
use crate::backend::cpu::{CpuBackend, PREFILL_CHUNK};
use crate::model::Model;
use crate::model::accounting::{table_from_model, weight_bytes_per_token};

use super::events::{BackendChoice, Event, LoadRequest, ModelInfo, ModelSource};
use super::memguard::{
    MemoryNeed, MemoryVerdict, WeightResidence, check_memory, cpu_kv_bytes, cpu_scratch_estimate, read_host_memory,
};
use super::residency::{MappedRegion, ResidencyProbe};
use super::worker::{ChatText, LoadedModel, ModelLoader};

/// Builds the chat text (tokenizer, renderer, streaming detokenizer) of a bound model.
pub type ChatTextFactory = fn(&Model, u32) -> Result<Box<dyn ChatText>, String>;

/// Loads real files and the demo model on the CPU backend.
pub struct EngineLoader {
    pub chat_text: ChatTextFactory,
}

impl EngineLoader {
    pub fn new() -> EngineLoader {
        EngineLoader {
            chat_text: super::chat_text::for_model,
        }
    }
}

impl Default for EngineLoader {
    fn default() -> Self {
        Self::new()
    }
}

/// The memory a CPU load of `model` with `ctx` will need (weights mapped from the file).
pub fn cpu_memory_need(model: &Model, ctx: u64) -> MemoryNeed {
    MemoryNeed {
        // An in-memory (demo) model is already allocated: only the cache is new.
        weight_bytes: if model.file.is_mapped() {
            model.file.file_size()
        } else {
            0
        },
        residence: WeightResidence::MappedFile,
        kv_bytes: cpu_kv_bytes(&model.hp, ctx),
        scratch_bytes: cpu_scratch_estimate(&model.hp, PREFILL_CHUNK as u64),
        kv_on_device: false,
    }
}

impl ModelLoader for EngineLoader {
    fn load(&mut self, req: &LoadRequest, notice: &mut dyn FnMut(Event)) -> Result<LoadedModel, String> {
        let (model, is_demo) = match &req.source {
            ModelSource::File(path) => (Model::open(path).map_err(|e| e.to_string())?, false),
            ModelSource::Demo { seed } => {
                let file = crate::genmodel::tiny_model(*seed, crate::genmodel::ExpertMix::Q2)
                    .map_err(|e| format!("demo model: {e}"))?;
                (Model::bind(file).map_err(|e| format!("demo model: {e}"))?, true)
            }
        };
        let ctx = req.ctx as u64;
        if ctx < 2 || ctx > model.hp.context_length {
            return Err(format!(
                "--ctx {ctx} is out of range: the model supports 2..={}",
                model.hp.context_length
            ));
        }
        let fallback_reason = match req.backend {
            BackendChoice::Cpu => None,
            BackendChoice::Auto => Some("no GPU backend in this build (built without the hip feature)".to_string()),
            BackendChoice::Hip => {
                return Err("this build has no HIP backend: rebuild with --features hip, or use --backend cpu".into());
            }
        };
        let need = cpu_memory_need(&model, ctx);
        match read_host_memory() {
            Ok(host) => match check_memory(&need, &host, None, &model.hp, ctx) {
                MemoryVerdict::Fits => {}
                MemoryVerdict::Slow(message) => notice(Event::Notice { message }),
                MemoryVerdict::Refuse(message) => return Err(message),
            },
            Err(e) => notice(Event::Notice {
                message: format!("memory check skipped: {e}"),
            }),
        }
        let text = (self.chat_text)(&model, ctx as u32)?;
        let per_token = weight_bytes_per_token(&model.hp, &table_from_model(&model)).total();
        let model = Arc::new(model);
        let backend = CpuBackend::new(model.clone(), ctx as usize, req.threads).map_err(|e| e.to_string())?;
        let mapped = model.file.is_mapped();
        let info = ModelInfo {
            name: model
                .file
                .get("general.name")
                .and_then(|v| v.as_str())
                .map(str::to_string)
                .unwrap_or_else(|| model.file.display_name()),
            file_bytes: model.file.file_size(),
            n_layer: model.hp.n_layer as u32,
            n_vocab: model.hp.n_vocab as u32,
            ctx: ctx as u32,
            backend: backend.name().to_string(),
            device: backend.device_name(),
            fallback_reason,
            weight_bytes_per_token: per_token,
            is_demo,
            ..Default::default()
        };
        let region: Option<Arc<dyn MappedRegion>> = mapped.then(|| model.file.clone() as Arc<dyn MappedRegion>);
        Ok(LoadedModel {
            backend: Box::new(backend),
            text,
            info,
            warmup: region,
            residency: mapped.then(|| ResidencyProbe::for_model(&model)),
        })
    }
}

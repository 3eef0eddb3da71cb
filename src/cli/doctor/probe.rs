//! What `doctor` reads from the machine: sysfs and procfs under the test hooks
//! `DS4_TEST_SYSFS_ROOT` and `DS4_TEST_PROCFS_ROOT`, device nodes under `DS4_TEST_DEV_ROOT` (each `/`
//! by default), the ROCm library (`DS4_HIP_LIBRARY` or the usual directories) and the model file.
//! Owns the reading only; every verdict is in `checks.rs`, so fake trees exercise the same code as
//! a real machine.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use crate::backend::knobs;
use crate::backend::memguard::meminfo_field;

/// The roots the probe reads under.
#[derive(Clone, Debug)]
pub struct Roots {
    pub sys: PathBuf,
    pub proc: PathBuf,
    pub dev: PathBuf,
    /// `DS4_HIP_LIBRARY`: the HIP runtime to use instead of searching for one.
    pub hip_library: Option<PathBuf>,
}

impl Roots {
    /// From the test hooks `DS4_TEST_SYSFS_ROOT`, `DS4_TEST_PROCFS_ROOT` and `DS4_TEST_DEV_ROOT`
    /// (default `/`), and `DS4_HIP_LIBRARY`.
    pub fn from_env() -> Roots {
        let root = |var: &str| knobs::path(var).unwrap_or_else(|| PathBuf::from("/"));
        Roots {
            sys: root(knobs::TEST_SYSFS_ROOT).join("sys"),
            proc: root(knobs::TEST_PROCFS_ROOT).join("proc"),
            dev: root(knobs::TEST_DEV_ROOT).join("dev"),
            hip_library: knobs::path(knobs::HIP_LIBRARY),
        }
    }
}

/// The HIP runtime library found, or where it was looked for.
#[derive(Clone, Debug, PartialEq)]
pub enum Rocm {
    Found { path: PathBuf, version: Option<String> },
    Missing { looked_in: String },
}

/// Device 0 as amdgpu and the KFD describe it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Gpu {
    /// "gfx1151", from the KFD topology's `gfx_target_version`.
    pub gfx: String,
    /// The DRM device directory (`.../class/drm/cardN/device`) when found.
    pub card: Option<PathBuf>,
    pub vram_total: Option<u64>,
    pub gtt_total: Option<u64>,
    pub perf_level: Option<String>,
}

/// Access of the calling process to a device node.
#[derive(Clone, Debug, PartialEq)]
pub enum Access {
    Missing,
    ReadWrite,
    /// Present but not readable and writable: the node's group (gid) the user lacks.
    Denied {
        gid: u32,
    },
}

/// The model file.
#[derive(Clone, Debug, PartialEq)]
pub struct ModelFile {
    pub path: PathBuf,
    pub bytes: u64,
    pub filesystem: String,
    pub cached_bytes: Option<u64>,
    /// "ds4 q2 imatrix (0731)" or the metadata's name; an error line when it does not open.
    pub what: Result<String, String>,
    /// Bytes the KV cache and scratch take at the configured context (when the file opened):
    /// the GPU session's (`backend::hip::footprint`) in a build with the HIP backend, else the
    /// CPU engine's.
    pub session_bytes: u64,
    /// The KV cache's share of `session_bytes`.
    pub kv_bytes: u64,
    /// ds4's DSpark support file next to the model, when there: its summary, or the one-line defect
    /// that keeps it from loading (docs/dspark.md#support-file).
    pub dspark: Option<Result<String, String>>,
    /// Its size (0 when absent).
    pub dspark_bytes: u64,
}

/// (KV, scratch) bytes of a session of `ctx` tokens: the GPU backend's plan where it is built in
/// (what its memory guard checks; prefill chunks of a GPU with or without `unified` memory), else
/// the CPU engine's estimate.
pub fn session_need(hp: &crate::model::HParams, ctx: u32, unified: bool) -> (u64, u64) {
    #[cfg(feature = "hip")]
    {
        use crate::backend::hip::prefill;
        // A malformed DS4_HIP_PREFILL_CHUNK is the backend's one-line error when it opens.
        let chunk = prefill::prefill_chunk(unified).unwrap_or(prefill::PREFILL_CHUNK);
        let s = crate::backend::hip::footprint::session_bytes(hp, ctx as usize, chunk);
        (s.kv, s.scratch)
    }
    #[cfg(not(feature = "hip"))]
    {
        let _ = unified;
        (
            crate::backend::memguard::cpu_kv_bytes(hp, ctx as u64),
            crate::backend::memguard::cpu_scratch_estimate(hp, 64),
        )
    }
}

/// Everything the checks look at.
#[derive(Clone, Debug, PartialEq)]
pub struct Facts {
    pub rocm: Rocm,
    pub gpu: Option<Gpu>,
    /// GPU targets the binary has code for.
    pub embedded: Vec<String>,
    pub kfd: Access,
    pub render: Option<(PathBuf, Access)>,
    /// `ttm.pages_limit` in pages of 4 KiB, when the module parameter is readable.
    pub ttm_pages_limit: Option<u64>,
    pub kernel: Option<String>,
    pub mem_total: Option<u64>,
    pub mem_available: Option<u64>,
    pub cma_free: u64,
    pub model: Option<ModelFile>,
    pub ctx: u32,
}

fn read_trim(p: &Path) -> Option<String> {
    std::fs::read_to_string(p).ok().map(|s| s.trim().to_string())
}

/// "gfx1151" from a KFD `gfx_target_version` (major·10000 + minor·100 + stepping; minor and
/// stepping are hex digits in the name).
pub fn gfx_name(version: u64) -> String {
    format!("gfx{}{:x}{:x}", version / 10000, (version / 100) % 100, version % 100)
}

/// Device 0: the first KFD topology node with a GPU target, and the first amdgpu DRM card.
fn probe_gpu(sys: &Path) -> Option<Gpu> {
    let nodes = sys.join("class/kfd/kfd/topology/nodes");
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(&nodes)
        .ok()?
        .filter_map(|e| Some(e.ok()?.path()))
        .collect();
    dirs.sort_by_key(|p| {
        p.file_name()
            .and_then(|n| n.to_str())
            .and_then(|n| n.parse::<u32>().ok())
    });
    let version = dirs.iter().find_map(|d| {
        let props = std::fs::read_to_string(d.join("properties")).ok()?;
        let v: u64 = props
            .lines()
            .find_map(|l| l.strip_prefix("gfx_target_version "))?
            .trim()
            .parse()
            .ok()?;
        (v != 0).then_some(v)
    })?;
    let mut cards: Vec<PathBuf> = std::fs::read_dir(sys.join("class/drm"))
        .map(|d| d.filter_map(|e| Some(e.ok()?.path())).collect())
        .unwrap_or_default();
    cards.retain(|p| {
        p.file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n.starts_with("card") && !n.contains('-'))
    });
    cards.sort();
    let card = cards
        .into_iter()
        .map(|c| c.join("device"))
        .find(|d| d.join("mem_info_vram_total").exists());
    let num = |name: &str| card.as_ref().and_then(|c| read_trim(&c.join(name))?.parse().ok());
    Some(Gpu {
        gfx: gfx_name(version),
        vram_total: num("mem_info_vram_total"),
        gtt_total: num("mem_info_gtt_total"),
        perf_level: card
            .as_ref()
            .and_then(|c| read_trim(&c.join("power_dpm_force_performance_level"))),
        card,
    })
}

/// The HIP runtime library: `hip_library` when set, else the first libamdhip64 in the ROCm
/// and system library directories; the version from ROCm's `.info/version` next to it, else from
/// the file name.
fn probe_rocm(hip_library: Option<&Path>) -> Rocm {
    if let Some(path) = hip_library {
        return if path.exists() {
            Rocm::Found {
                version: rocm_version(path),
                path: path.to_path_buf(),
            }
        } else {
            Rocm::Missing {
                looked_in: format!("DS4_HIP_LIBRARY={}", path.display()),
            }
        };
    }
    let mut dirs: Vec<PathBuf> = Vec::new();
    if let Some(r) = knobs::path(knobs::ROCM_PATH) {
        dirs.push(r.join("lib"));
    }
    dirs.extend(
        ["/opt/rocm/lib", "/usr/lib/x86_64-linux-gnu", "/usr/lib64", "/usr/lib"]
            .iter()
            .map(PathBuf::from),
    );
    for d in &dirs {
        for name in [
            "libamdhip64.so",
            "libamdhip64.so.7",
            "libamdhip64.so.6",
            "libamdhip64.so.5",
        ] {
            let path = d.join(name);
            if path.exists() {
                return Rocm::Found {
                    version: rocm_version(&path),
                    path,
                };
            }
        }
    }
    Rocm::Missing {
        looked_in: dirs
            .iter()
            .map(|d| d.display().to_string())
            .collect::<Vec<_>>()
            .join(", "),
    }
}

fn rocm_version(lib: &Path) -> Option<String> {
    let real = std::fs::canonicalize(lib).unwrap_or_else(|_| lib.to_path_buf());
    let info = real.parent()?.parent()?.join(".info/version");
    if let Some(v) = read_trim(&info) {
        return Some(v);
    }
    let name = real.file_name()?.to_str()?;
    let v = name.strip_prefix("libamdhip64.so.")?;
    (!v.is_empty()).then(|| v.to_string())
}

/// Uid and supplementary groups of this process, from `<proc>/self/status`.
fn identity(proc: &Path) -> Option<(u32, Vec<u32>)> {
    let status = std::fs::read_to_string(proc.join("self/status")).ok()?;
    let field = |name: &str| status.lines().find_map(|l| l.strip_prefix(name)).map(str::to_string);
    let uid = field("Uid:")?.split_whitespace().nth(1)?.parse().ok()?;
    let mut groups: Vec<u32> = field("Groups:")
        .unwrap_or_default()
        .split_whitespace()
        .filter_map(|g| g.parse().ok())
        .collect();
    if let Some(gid) = field("Gid:").and_then(|g| g.split_whitespace().nth(1)?.parse().ok()) {
        groups.push(gid);
    }
    Some((uid, groups))
}

/// Read-write access by the mode bits, as the kernel decides it for a non-root user.
fn access(node: &Path, who: Option<&(u32, Vec<u32>)>) -> Access {
    let Ok(m) = std::fs::metadata(node) else {
        return Access::Missing;
    };
    let mode = m.mode();
    let Some((uid, groups)) = who else {
        return Access::ReadWrite;
    };
    let rw = if *uid == 0 {
        true
    } else if m.uid() == *uid {
        mode & 0o600 == 0o600
    } else if groups.contains(&m.gid()) {
        mode & 0o060 == 0o060
    } else {
        mode & 0o006 == 0o006
    };
    if rw {
        Access::ReadWrite
    } else {
        Access::Denied { gid: m.gid() }
    }
}

fn first_render_node(dev: &Path) -> Option<PathBuf> {
    let mut nodes: Vec<PathBuf> = std::fs::read_dir(dev.join("dri"))
        .ok()?
        .filter_map(|e| Some(e.ok()?.path()))
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("renderD"))
        })
        .collect();
    nodes.sort();
    nodes.into_iter().next()
}

/// The filesystem type of `path` from `<proc>/self/mountinfo` (the longest mount point above it).
fn filesystem_of(proc: &Path, path: &Path) -> String {
    let abs = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
    let Ok(info) = std::fs::read_to_string(proc.join("self/mountinfo")) else {
        return "unknown".into();
    };
    info.lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let mount = *f.get(4)?;
            let sep = f.iter().position(|x| *x == "-")?;
            let fstype = *f.get(sep + 1)?;
            abs.starts_with(mount).then(|| (mount.len(), fstype.to_string()))
        })
        .max_by_key(|(n, _)| *n)
        .map_or_else(|| "unknown".into(), |(_, t)| t)
}

fn probe_model(proc: &Path, path: &Path, ctx: u32, unified: bool) -> ModelFile {
    let bytes = std::fs::metadata(path).map(|m| m.len()).unwrap_or(0);
    let cached_bytes = std::fs::File::open(path)
        .ok()
        .and_then(|f| crate::backend::residency::file_cached_bytes(&f).ok());
    let opened = crate::model::Model::open(path).map_err(|e| e.to_string());
    let (kv_bytes, scratch_bytes) = opened.as_ref().map_or((0, 0), |m| session_need(&m.hp, ctx, unified));
    let support = crate::model::dspark::beside(path);
    let dspark_bytes = support
        .as_ref()
        .and_then(|p| std::fs::metadata(p).ok())
        .map_or(0, |m| m.len());
    let dspark = match (&support, &opened) {
        (Some(p), Ok(m)) => Some(
            crate::model::dspark::DsparkModel::open(p, &m.hp)
                .map(|d| d.summary())
                .map_err(|e| e.to_string()),
        ),
        _ => None,
    };
    ModelFile {
        dspark,
        dspark_bytes,
        path: path.to_path_buf(),
        bytes,
        filesystem: filesystem_of(proc, path),
        cached_bytes,
        what: opened.map(|m| crate::model::checkpoint::describe_file(&m.file)),
        session_bytes: kv_bytes + scratch_bytes,
        kv_bytes,
    }
}

/// GPU targets this binary has code for.
pub fn embedded_targets() -> Vec<String> {
    #[cfg(feature = "hip")]
    {
        crate::backend::hip::kernels::embedded_targets()
            .into_iter()
            .map(str::to_string)
            .collect()
    }
    #[cfg(not(feature = "hip"))]
    {
        Vec::new()
    }
}

/// Read everything under `roots`, with the model at `model` (if any) and a context of `ctx`.
pub fn probe(roots: &Roots, model: Option<&Path>, ctx: u32) -> Facts {
    let who = identity(&roots.proc);
    let meminfo = std::fs::read_to_string(roots.proc.join("meminfo")).unwrap_or_default();
    let gpu = probe_gpu(&roots.sys);
    // The session figures are for the GPU found, or for a Strix Halo (unified memory) without one.
    let unified = gpu
        .as_ref()
        .is_none_or(|g| crate::backend::copy_budget::is_unified(false, &g.gfx));
    Facts {
        rocm: probe_rocm(roots.hip_library.as_deref()),
        embedded: embedded_targets(),
        kfd: access(&roots.dev.join("kfd"), who.as_ref()),
        render: first_render_node(&roots.dev).map(|p| {
            let a = access(&p, who.as_ref());
            (p, a)
        }),
        ttm_pages_limit: read_trim(&roots.sys.join("module/ttm/parameters/pages_limit")).and_then(|v| v.parse().ok()),
        kernel: read_trim(&roots.proc.join("sys/kernel/osrelease")),
        mem_total: meminfo_field(&meminfo, "MemTotal"),
        mem_available: meminfo_field(&meminfo, "MemAvailable"),
        cma_free: meminfo_field(&meminfo, "CmaFree").unwrap_or(0),
        model: model.map(|p| probe_model(&roots.proc, p, ctx, unified)),
        gpu,
        ctx,
    }
}

//! The config file: documented defaults, one-line errors naming the key, flags over the file.

use ds4_chat::cli::chat::{Args, apply_flags};
use ds4_chat::cli::{GenerationArgs, PlacementArgs};
use ds4_chat::engine::events::{BackendChoice, WeightsMode};
use ds4_chat::model::chat::ThinkMode;
use ds4_chat::tui::config::{self, Config, Theme};

#[test]
fn documented_defaults_match_the_built_in_defaults() {
    let text = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/config/default.toml")).unwrap();
    assert_eq!(config::parse(&text).unwrap(), Config::default());
    // And the built-in defaults are ds4's (docs/prompt.md#run-defaults, docs/sampler.md#defaults).
    let d = Config::default();
    assert_eq!(d.system, "You are a helpful assistant");
    assert_eq!(
        (
            d.sampling.temperature,
            d.sampling.top_p,
            d.sampling.top_k,
            d.sampling.min_p
        ),
        (1.0, 1.0, 0, 0.05)
    );
    assert_eq!(d.sampling.seed, None);
    assert_eq!(d.think, ThinkMode::High);
}

#[test]
fn values_are_read() {
    let c = config::parse(
        "ctx = 8192\nbackend = \"cpu\"\nweights = \"map\"\nthink = \"off\"\nsystem = \"\"\ntemp = 0\n\
         top_p = 0.9\ntop_k = 40\nmin_p = 0\nseed = 5\nmax_tokens = 100\nside_panel = false\ntheme = \"light\"\nthreads = 2\n",
    )
    .unwrap();
    assert_eq!(c.ctx, 8192);
    assert_eq!(c.backend, BackendChoice::Cpu);
    assert_eq!(c.weights, WeightsMode::Map);
    assert_eq!(c.think, ThinkMode::Off);
    assert_eq!(c.system, "");
    assert_eq!(c.sampling.temperature, 0.0);
    assert_eq!(c.sampling.top_p, 0.9);
    assert_eq!(c.sampling.top_k, 40);
    assert_eq!(c.sampling.seed, Some(5));
    assert_eq!(c.max_tokens, 100);
    assert!(!c.side_panel);
    assert_eq!(c.theme, Theme::Light);
    assert_eq!(c.threads, 2);
}

#[test]
fn the_remote_table_is_read_and_checked() {
    let c = config::parse(
        "[remote]\nurl = \"http://gpu:8000/v1\"\nmodel = \"deepseek-ai/DeepSeek-V4-Flash\"\n\
         api_key_env = \"DS4_KEY\"\ntimeout = 30\n",
    )
    .unwrap();
    assert_eq!(c.remote.url.as_deref(), Some("http://gpu:8000/v1"));
    assert_eq!(c.remote.model.as_deref(), Some("deepseek-ai/DeepSeek-V4-Flash"));
    assert_eq!(c.remote.api_key_env.as_deref(), Some("DS4_KEY"));
    assert_eq!(c.remote.timeout_secs, 30);
    assert_eq!(Config::default().remote.url, None);
    let e = err("[remote]\ntimeout = 0\n");
    assert!(e.contains("`remote.timeout`") && e.contains('0'), "{e}");
    let e = err("[remote]\nendpoint = \"x\"\n");
    assert!(e.contains("line 2") && e.contains("endpoint"), "{e}");
    // The flags win over the file.
    let args = Args {
        remote: Some("http://other:1".into()),
        remote_model: Some("m2".into()),
        api_key_env: Some("OTHER_KEY".into()),
        ..Default::default()
    };
    let c = apply_flags(c, &args).unwrap();
    assert_eq!(
        (
            c.remote.url.as_deref(),
            c.remote.model.as_deref(),
            c.remote.api_key_env.as_deref()
        ),
        (Some("http://other:1"), Some("m2"), Some("OTHER_KEY"))
    );
}

fn err(text: &str) -> String {
    let e = config::parse(text).unwrap_err();
    assert!(!e.contains('\n'), "error must be one line: {e:?}");
    e
}

#[test]
fn unknown_keys_and_bad_values_name_the_key() {
    let cases: &[(&str, &[&str])] = &[
        ("ctx = 4096\ntemperature = 0.5\n", &["line 2", "temperature"]),
        ("ctx = 100\n", &["`ctx`", "100"]),
        ("backend = \"cuda\"\n", &["`backend`", "cuda"]),
        ("temp = -1\n", &["`temp`"]),
        ("top_p = 0\n", &["`top_p`"]),
        ("think = \"maybe\"\n", &["`think`", "maybe"]),
        ("ctx = \"big\"\n", &["line 1"]),
        ("seed = -3\n", &["`seed`"]),
        ("theme = \"neon\"\n", &["neon"]),
    ];
    for (text, wants) in cases {
        let e = err(text);
        assert!(wants.iter().all(|w| e.contains(w)), "{text:?}: {e}");
    }
}

#[test]
fn missing_file_gives_defaults_and_load_names_the_file() {
    let dir = std::env::temp_dir().join(format!("ds4-chat-cfg-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let missing = dir.join("none.toml");
    assert_eq!(config::load(&missing).unwrap(), Config::default());
    let bad = dir.join("bad.toml");
    std::fs::write(&bad, "colour = 1\n").unwrap();
    let e = config::load(&bad).unwrap_err();
    assert!(e.contains("bad.toml") && e.contains("colour"), "{e}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn flags_override_the_file() {
    let file = config::parse("ctx = 8192\ntemp = 0.3\nthink = \"off\"\n").unwrap();
    let args = Args {
        ctx: Some(65536),
        think: ds4_chat::cli::ThinkArgs {
            think_max: true,
            ..Default::default()
        },
        generation: GenerationArgs {
            temp: Some(0.8),
            ..Default::default()
        },
        placement: PlacementArgs {
            backend: Some("cpu".into()),
            ..Default::default()
        },
        ..Default::default()
    };
    let c = apply_flags(file.clone(), &args).unwrap();
    assert_eq!(c.ctx, 65536);
    assert_eq!(c.think, ThinkMode::Max);
    assert_eq!(c.sampling.temperature, 0.8);
    assert_eq!(c.backend, BackendChoice::Cpu);
    let bad = Args {
        generation: GenerationArgs {
            top_p: Some(1.5),
            ..Default::default()
        },
        ..Default::default()
    };
    assert!(apply_flags(file.clone(), &bad).unwrap_err().starts_with("--top-p"));
    let bad = Args {
        placement: PlacementArgs {
            weights: Some("mmap".into()),
            ..Default::default()
        },
        ..Default::default()
    };
    assert!(apply_flags(file, &bad).unwrap_err().starts_with("--weights"));
}

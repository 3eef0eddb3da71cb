//! Replays the committed, minimized fuzz corpus (fuzz/corpus/gguf_reader/) through the loading path the
//! fuzz target drives (fuzz/load_untrusted.rs): no input may panic.

include!("../../fuzz/load_untrusted.rs");

#[test]
fn every_corpus_file_loads_or_fails_cleanly() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus/gguf_reader");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    assert!(files.len() >= 10, "only {} corpus files", files.len());
    let total: u64 = files.iter().map(|p| std::fs::metadata(p).unwrap().len()).sum();
    assert!(total < 1 << 20, "corpus is {total} bytes; keep it under 1 MiB");
    let mut bound = 0;
    for p in &files {
        let bytes = std::fs::read(p).unwrap();
        let r = std::panic::catch_unwind(|| load_untrusted(&bytes));
        match r {
            Ok(true) => bound += 1,
            Ok(false) => {}
            Err(_) => panic!("{} panics the loader", p.display()),
        }
    }
    // The seed micro model (and its surviving mutants) bind; everything else is refused.
    assert!(bound >= 1, "no corpus file binds as a model");
    eprintln!("{} corpus files ({total} bytes), {bound} bind", files.len());
}

//! The `rill` binary end to end: output formats, streaming text, and one-line errors (never a panic).

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const FIX: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures");
const PROMPT_A: &str = "The quick brown fox jumps over the lazy dog.";
const PROMPT_A_IDS: [u32; 14] = [
    785, 3974, 293, 4830, 282, 5131, 7784, 82, 916, 279, 1187, 4246, 5562, 13,
];

fn rill(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_rill"))
        .args(args)
        .output()
        .expect("run rill")
}

fn fixture(name: &str) -> String {
    Path::new(FIX).join(name).to_string_lossy().into_owned()
}

fn tmp(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("rill-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("tmp dir");
    dir.join(name)
}

/// A failing command prints exactly one `error:` line and exits non-zero, without a panic.
fn assert_clean_error(out: &Output, needle: &str) {
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "expected failure, stderr: {err}");
    assert_eq!(out.status.code(), Some(1), "stderr: {err}");
    assert!(!err.contains("panicked"), "panic: {err}");
    let lines: Vec<&str> = err.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "expected one line, got: {err}");
    assert!(lines[0].starts_with("error: "), "{err}");
    assert!(lines[0].contains(needle), "'{needle}' not in: {err}");
}

#[test]
fn tokenize_prints_json_ids() {
    let out = rill(&["tokenize", "-m", &fixture("tiny-dense.F16.gguf"), PROMPT_A]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let ids: Vec<u32> = serde_json::from_slice(&out.stdout).expect("json array");
    assert_eq!(ids, PROMPT_A_IDS);
}

#[test]
fn greedy_run_streams_the_reference_continuation() {
    for be in common::backends() {
        greedy_run_on(be.name());
    }
}

fn greedy_run_on(backend: &str) {
    let model = fixture("tiny-dense.F16.gguf");
    let args = [
        "run",
        "-m",
        &model,
        "-p",
        PROMPT_A,
        "-n",
        "8",
        "--temp",
        "0",
        "--backend",
        backend,
    ];
    let out = rill(&args);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(err.contains("prompt: 14 tokens"), "speed line missing: {err}");
    assert!(err.contains("generation: 8 tokens"), "speed line missing: {err}");
    // The first 8 greedy tokens of the transformers reference, decoded with rill's tokenizer.
    let file = rill::gguf::GgufFile::open(fixture("tiny-dense.F16.gguf")).expect("open");
    let tok = rill::tokenizer::Tokenizer::from_gguf(&file).expect("tokenizer");
    let bytes = std::fs::read(fixture("tiny-dense.reference.safetensors")).expect("ref");
    let st = safetensors::SafeTensors::deserialize(&bytes).expect("st");
    let greedy: Vec<u32> = st
        .tensor("greedy_ids")
        .expect("greedy_ids")
        .data()
        .chunks_exact(4)
        .map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]) as u32)
        .collect();
    let want = tok.decode(&greedy[..8], false);
    let got = String::from_utf8_lossy(&out.stdout);
    assert_eq!(got.trim_end_matches('\n'), want, "backend {backend}");
}

#[test]
fn logits_writes_safetensors() {
    let path = tmp("logits.safetensors");
    let ids = PROMPT_A_IDS.iter().map(|i| i.to_string()).collect::<Vec<_>>().join(",");
    let out = rill(&[
        "logits",
        "-m",
        &fixture("tiny-dense.F16.gguf"),
        "--tokens",
        &ids,
        "-o",
        path.to_str().expect("path"),
    ]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let bytes = std::fs::read(&path).expect("output");
    let st = safetensors::SafeTensors::deserialize(&bytes).expect("safetensors");
    let logits = st.tensor("logits").expect("logits");
    assert_eq!(logits.dtype(), safetensors::Dtype::F32);
    assert_eq!(logits.shape(), &[14, 8192]);
    let toks = st.tensor("tokens").expect("tokens");
    assert_eq!(toks.dtype(), safetensors::Dtype::I32);
    assert_eq!(toks.shape(), &[14]);
    // Same numbers as the transformers reference (the e2e tests check every tolerance; here the wiring).
    let rbytes = std::fs::read(fixture("tiny-dense.reference.safetensors")).expect("ref");
    let r = safetensors::SafeTensors::deserialize(&rbytes).expect("st");
    let want = r.tensor("logits_a").expect("logits_a");
    let f = |d: &[u8]| {
        d.chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect::<Vec<f32>>()
    };
    let (g, w) = (f(logits.data()), f(want.data()));
    let worst = g.iter().zip(&w).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
    assert!(worst < 1e-3, "max abs diff {worst}");
}

#[test]
fn info_reports_arch_and_type_mix() {
    let out = rill(&["info", "-m", &fixture("tiny-dense.Q4_K_M.gguf")]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let s = String::from_utf8_lossy(&out.stdout);
    for needle in [
        "qwen35",
        "Q4_K",
        "Q5_0",
        "Q8_0",
        "F32",
        "tensors:",
        "8 (6 Gated DeltaNet, 2 gated attention)",
        // 6 x (3 x 1024 conv + 4 x 128 x 128 delta) + 2 x (2 x 4096 x 256) KV floats, 4 bytes each.
        "state:        17.57 MiB a sequence at 4096 tokens",
    ] {
        assert!(s.contains(needle), "'{needle}' missing from:\n{s}");
    }
}

#[test]
fn missing_file_is_one_line_error() {
    assert_clean_error(
        &rill(&["info", "-m", "/nonexistent/model.gguf"]),
        "/nonexistent/model.gguf",
    );
}

#[test]
fn truncated_file_is_one_line_error() {
    let bytes = std::fs::read(fixture("tiny-dense.F16.gguf")).expect("fixture");
    let path = tmp("truncated.gguf");
    std::fs::write(&path, &bytes[..bytes.len() / 2]).expect("write");
    let out = rill(&["run", "-m", path.to_str().expect("path"), "-p", "hi", "-n", "1"]);
    assert_clean_error(&out, "malformed GGUF");
}

#[test]
fn not_a_gguf_is_one_line_error() {
    let path = tmp("text.gguf");
    std::fs::write(&path, b"this is not a model file at all").expect("write");
    assert_clean_error(&rill(&["info", "-m", path.to_str().expect("path")]), "bad magic");
}

#[test]
fn unknown_backend_is_one_line_error() {
    let out = rill(&[
        "run",
        "-m",
        &fixture("tiny-dense.F16.gguf"),
        "-p",
        "hi",
        "--backend",
        "nope",
    ]);
    assert_clean_error(&out, "backend 'nope'");
}

#[test]
fn context_overflow_is_one_line_error() {
    let out = rill(&[
        "run",
        "-m",
        &fixture("tiny-dense.F16.gguf"),
        "-p",
        PROMPT_A,
        "-n",
        "10",
        "--ctx",
        "16",
    ]);
    assert_clean_error(&out, "would exceed the context of 16 tokens");
}

#[test]
fn vocab_only_file_cannot_run_but_tokenizes() {
    let out = rill(&["run", "-m", &fixture("qwen3-vocab.gguf"), "-p", "hi", "-n", "1"]);
    assert_clean_error(&out, "token_embd.weight");
    let out = rill(&["tokenize", "-m", &fixture("qwen3-vocab.gguf"), "Hello world"]);
    assert!(out.status.success());
    let ids: Vec<u32> = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(ids, [9707, 1879]);
}

/// Where this build has the cuda backend but the machine no NVIDIA driver or GPU, `--backend cuda`
/// is one error line and a non-zero exit (cudarc would panic without the check), and `auto`
/// falls through to another backend without a word about CUDA.
#[test]
fn cuda_without_a_gpu_is_one_error_line_and_auto_falls_through() {
    if !rill::backend::available().contains(&"cuda") || common::cuda().is_some() {
        return;
    }
    let model = fixture("tiny-dense.F16.gguf");
    let base = ["run", "-m", &model, "-p", "hi", "-n", "2", "--temp", "0", "--backend"];
    let out = rill(&[&base[..], &["cuda"]].concat());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "exit status {:?}", out.status);
    assert!(
        out.stdout.is_empty(),
        "printed {:?}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.starts_with("error: ") && err.contains("cuda"), "{err}");
    let out = rill(&[&base[..], &["auto"]].concat());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(!err.to_lowercase().contains("cuda"), "{err}");
}

/// `--precision` is one flag shared by every command that runs a model: `rill bench` names the
/// tier the backend ran at (the CPU backend has only the exact tier, so `fast` runs exact there),
/// and an unknown tier is refused before anything runs.
#[test]
fn bench_names_the_precision_tier() {
    let model = fixture("tiny-dense.F16.gguf");
    let bench = |precision: &str, json: bool| {
        let mut args = vec![
            "bench",
            "-m",
            &model,
            "--backend",
            "cpu",
            "-p",
            "",
            "-n",
            "2",
            "-r",
            "1",
            "--no-warmup",
            "--precision",
            precision,
        ];
        if json {
            args.push("--json");
        }
        rill(&args)
    };
    let out = bench("exact", false);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(text.contains("backend: cpu | precision: exact |"), "{text}");
    let out = bench("fast", true);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(v["precision"], "exact", "{v}");
    // Without the flag, every command asks for the fast tier (a backend without one runs exact).
    for cmd in ["bench", "run", "chat", "serve"] {
        let help = rill(&[cmd, "--help"]);
        let text = String::from_utf8_lossy(&help.stdout);
        let flag = text.split("--precision").nth(1).unwrap_or("");
        let flag = &flag[..flag.find("\n  -").unwrap_or(flag.len())];
        assert!(flag.contains("[default: fast]"), "{cmd}: {text}");
    }
    let out = bench("loose", false);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(err.contains("expected exact or fast"), "{err}");
    assert!(!err.contains("panicked"), "{err}");
}

/// `rill run` and `rill chat` share one set of sampling flags, checked the same way.
#[test]
fn run_and_chat_refuse_the_same_bad_sampling_flag() {
    let model = fixture("tiny-dense.F16.gguf");
    let run = rill(&["run", "-m", &model, "-p", "hi", "-n", "1", "--top-p", "1.5"]);
    let chat = rill(&["chat", "-m", &model, "--top-p", "1.5"]);
    let (e_run, e_chat) = (
        String::from_utf8_lossy(&run.stderr),
        String::from_utf8_lossy(&chat.stderr),
    );
    assert_clean_error(&run, "top");
    assert_clean_error(&chat, "top");
    assert_eq!(e_run, e_chat);
}

/// `rill bench --batch` measures batched generation: one row per batch size and generation
/// length, each with its batch size and aggregate tokens/s in the JSON, a per-sequence column
/// in the table.
#[test]
fn bench_measures_batched_generation() {
    let model = fixture("tiny-dense.Q8_0.gguf");
    let args = |json: bool| {
        let mut a = vec![
            "bench",
            "-m",
            &model,
            "--backend",
            "cpu",
            "-p",
            "",
            "-n",
            "3",
            "-b",
            "1,4",
            "-r",
            "1",
            "--no-warmup",
        ];
        if json {
            a.push("--json");
        }
        rill(&a)
    };
    let out = args(true);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    let tests = v["tests"].as_array().expect("tests");
    let names: Vec<&str> = tests.iter().map(|t| t["test"].as_str().expect("name")).collect();
    assert_eq!(names, ["tg3", "tg3 x1", "tg3 x4"], "{v}");
    assert_eq!(tests[2]["batch"], 4, "{v}");
    assert!(
        tests
            .iter()
            .all(|t| t["tokens_per_s_mean"].as_f64().is_some_and(|x| x > 0.0)),
        "{v}"
    );
    let out = args(false);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("| test | t/s | t/s per sequence |") && text.contains("| tg3 x4 |"),
        "{text}"
    );
}

/// `rill bench-serve` against a running `rill serve`: every level of the sweep reports its
/// requests, the output tokens they streamed, and latency quantiles in order.
#[test]
fn bench_serve_drives_a_running_server() {
    use std::io::{BufRead, BufReader};
    use std::process::Stdio;
    let model = fixture("tiny-dense.Q8_0.gguf");
    let mut server = Command::new(env!("CARGO_BIN_EXE_rill"))
        .args(["serve", "-m", &model, "--backend", "cpu", "--port", "0"])
        .stderr(Stdio::piped())
        .spawn()
        .expect("start rill serve");
    let mut lines = BufReader::new(server.stderr.take().expect("stderr")).lines();
    let url = lines
        .by_ref()
        .map_while(|l| l.ok())
        .find_map(|l| l.strip_prefix("listening on ").map(str::to_owned))
        .expect("the server's address");
    let out = rill(&[
        "bench-serve",
        "--url",
        &url,
        "-c",
        "1,3",
        "-N",
        "3",
        "-p",
        "12",
        "-n",
        "5",
        "--vocab",
        "200",
        "--json",
    ]);
    let _ = server.kill();
    let _ = server.wait();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    let levels = v["levels"].as_array().expect("levels");
    assert_eq!(levels.len(), 2, "{v}");
    for (l, c) in levels.iter().zip([1, 3]) {
        assert_eq!(l["concurrency"], c, "{v}");
        assert_eq!(l["requests"], 3, "{v}");
        let tokens = l["output_tokens"].as_u64().expect("tokens");
        assert!((3..=15).contains(&tokens), "{v}");
        let q = |k: &str| l[k].as_f64().expect(k);
        assert!(q("output_tokens_per_s") > 0.0 && q("ttft_ms_p50") > 0.0, "{v}");
        assert!(
            q("ttft_ms_p50") <= q("ttft_ms_p99") && q("itl_ms_p50") <= q("itl_ms_p99"),
            "{v}"
        );
    }
}

/// `rill serve --kv-mem`: without `--parallel` the slots are what the budget holds (printed at
/// start); a `--parallel` beyond it, or a budget below one sequence, is one clean error.
#[test]
fn serve_sizes_its_slots_from_kv_mem() {
    use std::io::{BufRead, BufReader};
    use std::process::Stdio;
    let model = fixture("tiny-dense.Q8_0.gguf");
    let base = [
        "serve",
        "-m",
        &model,
        "--backend",
        "cpu",
        "--port",
        "0",
        "--ctx",
        "4096",
    ];
    // One sequence of the tiny model at 4096 tokens is 17.6 MiB of state.
    let mut server = Command::new(env!("CARGO_BIN_EXE_rill"))
        .args([&base[..], &["--kv-mem", "40"]].concat())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start rill serve");
    let lines: Vec<String> = BufReader::new(server.stderr.take().expect("stderr"))
        .lines()
        .map_while(|l| l.ok())
        .take_while(|l| !l.starts_with("listening on "))
        .collect();
    let _ = server.kill();
    let _ = server.wait();
    assert!(
        lines.iter().any(|l| l.starts_with("batch: 2 sequences of 4096 tokens")),
        "{lines:?}"
    );
    let out = rill(&[&base[..], &["--kv-mem", "40", "--parallel", "3"]].concat());
    assert_clean_error(&out, "--kv-mem holds 2 such sequences");
    let out = rill(&[&base[..], &["--kv-mem", "1"]].concat());
    assert_clean_error(&out, "--kv-mem holds no sequence");
}

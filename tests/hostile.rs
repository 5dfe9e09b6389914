//! Issue 12 ("Hostile input"): the findings of a hostile tester, each reproduced through the
//! `rill` binary. The abort and the hang run in a child process under a memory limit or a
//! timeout, so on the old code they fail instead of taking the test run down.
//!
//! `RILL_TEST_BIN=/path/to/older/rill cargo test --test hostile` runs these against another
//! build (they fail on the code before the fixes).
#![cfg(unix)]

use std::io::Write;
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use rill::gguf::Value;

mod common;

use common::gguf::{keep_t, rewrite_fixture};

fn bin() -> PathBuf {
    std::env::var_os("RILL_TEST_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_rill")))
}

fn fixture(name: &str) -> String {
    common::fixture(name).to_string_lossy().into_owned()
}

fn tmp_dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("rill-hostile-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).expect("tmp dir");
    d
}

fn s(p: &Path) -> &str {
    p.to_str().expect("utf-8 path")
}

/// Run rill; a run still going after `limit` is killed and reported as `None` (a hang).
fn rill_within(args: &[&str], limit: Duration) -> Option<Output> {
    let child = Command::new(bin())
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn rill");
    wait_within(child, limit)
}

fn wait_within(mut child: Child, limit: Duration) -> Option<Output> {
    let start = Instant::now();
    loop {
        if child.try_wait().expect("wait").is_some() {
            return Some(child.wait_with_output().expect("output"));
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn rill(args: &[&str]) -> Output {
    rill_within(args, Duration::from_secs(120)).unwrap_or_else(|| panic!("rill {args:?} hung"))
}

/// A failing command prints exactly one `error:` line containing `needle` and exits with 1.
fn assert_clean_error(out: &Output, needle: &str) {
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "status {:?}, stderr: {err}", out.status);
    assert!(!err.contains("panicked"), "panic: {err}");
    let lines: Vec<&str> = err.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "expected one line, got: {err}");
    assert!(lines[0].starts_with("error: "), "{err}");
    assert!(lines[0].contains(needle), "'{needle}' not in: {err}");
}

fn mkfifo(path: &Path) {
    let st = Command::new("mkfifo").arg(path).status().expect("mkfifo");
    assert!(st.success());
}

// ---------------------------------------------------------------------------------------------
// Finding 1: metadata arrays amplified memory 32x; under a limit the allocation aborted.

/// A GGUF with no tensors and one u8 array of `n` elements (written by hand: building it as
/// `Value`s would itself take 32 bytes per element).
fn write_big_u8_array(path: &Path, n: u64) {
    let mut f = std::io::BufWriter::new(std::fs::File::create(path).expect("create"));
    let mut put = |b: &[u8]| f.write_all(b).expect("write");
    put(b"GGUF");
    put(&3u32.to_le_bytes());
    put(&0u64.to_le_bytes()); // tensors
    put(&1u64.to_le_bytes()); // kvs
    put(&3u64.to_le_bytes());
    put(b"big");
    put(&9u32.to_le_bytes()); // array
    put(&0u32.to_le_bytes()); // of u8
    put(&n.to_le_bytes());
    let chunk = vec![1u8; 1 << 20];
    let mut left = n;
    while left > 0 {
        let k = left.min(chunk.len() as u64) as usize;
        put(&chunk[..k]);
        left -= k as u64;
    }
    f.flush().expect("flush");
}

#[test]
fn big_metadata_array_under_a_memory_limit() {
    let d = tmp_dir("array");
    let path = d.join("big-array.gguf");
    // 64 MiB on disk; decoded into 32-byte values it would need 2 GiB.
    write_big_u8_array(&path, 64 << 20);
    // 1 GiB of address space: the binary, the 64 MiB map and ordinary allocations fit.
    let child = Command::new("sh")
        .arg("-c")
        .arg("ulimit -v 1048576 && exec \"$0\" \"$@\"")
        .arg(bin())
        .args(["info", "-m", s(&path)])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let out = wait_within(child, Duration::from_secs(60)).expect("rill info hung");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "status {:?}: {err}", out.status);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("gguf version: 3"), "{stdout}");
    assert!(stdout.contains("not runnable"), "{stdout}");
    let _ = std::fs::remove_dir_all(&d);
}

/// A size from the command line that cannot be allocated is a clean error, not an abort.
#[test]
fn impossible_allocation_from_the_command_line_is_an_error() {
    let out = rill(&[
        "bench",
        "-m",
        &fixture("tiny-dense.F16.gguf"),
        "--backend",
        "cpu",
        "-p",
        "4000000000000000",
        "-n",
        "",
    ]);
    assert_clean_error(
        &out,
        "out of memory: cannot allocate 16000000000000000 bytes for the benchmark prompt",
    );
}

// ---------------------------------------------------------------------------------------------
// Finding 3: -n wrapped the context check.

#[test]
fn huge_n_predict_is_refused() {
    // The finding's case: a 14-token prompt, so the sum wrapped to 12 in release builds.
    let prompt = "The quick brown fox jumps over the lazy dog.";
    let cases = [
        (
            &["-n", "18446744073709551614"][..],
            "-n 18446744073709551614 plus the prompt's 14 tokens",
        ),
        (
            &["-n", "18446744073709551615"][..],
            "-n 18446744073709551615 plus the prompt's 14 tokens",
        ),
        (&["-n", "5000000000"][..], "needs a context of 5000000014 tokens"),
        (
            &["-n", "10", "--ctx", "5000000000"][..],
            "--ctx 5000000000 needs a context",
        ),
    ];
    for (extra, needle) in cases {
        let model = fixture("tiny-dense.F16.gguf");
        let mut args = vec!["run", "-m", &model, "-p", prompt, "--temp", "0", "--backend", "cpu"];
        args.extend_from_slice(extra);
        let out = rill(&args);
        assert_clean_error(&out, needle);
        assert!(out.stdout.is_empty(), "generated text for {extra:?}");
    }
}

// ---------------------------------------------------------------------------------------------
// Finding 5: `logits -o` replaced special files and links.

fn logits_to(out: &Path) -> Output {
    rill(&[
        "logits",
        "-m",
        &fixture("tiny-dense.F16.gguf"),
        "--tokens",
        "1,2",
        "--backend",
        "cpu",
        "-o",
        s(out),
    ])
}

#[test]
fn logits_output_refuses_special_files() {
    let d = tmp_dir("logits-special");
    let fifo = d.join("fifo");
    mkfifo(&fifo);
    assert_clean_error(&logits_to(&fifo), "is a FIFO (named pipe)");
    assert!(
        std::fs::metadata(&fifo).expect("fifo").file_type().is_fifo(),
        "the FIFO was replaced"
    );
    // A link to a device: refused, and the link is left alone.
    let link = d.join("null-link");
    std::os::unix::fs::symlink("/dev/null", &link).expect("symlink");
    assert_clean_error(&logits_to(&link), "character device (through a symbolic link)");
    assert!(std::fs::symlink_metadata(&link).expect("link").file_type().is_symlink());
    assert_clean_error(&logits_to(&d), "is a directory");
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn logits_output_writes_through_links_and_keeps_permissions() {
    let d = tmp_dir("logits-link");
    let real = d.join("real.safetensors");
    std::fs::write(&real, b"old").expect("write");
    std::fs::set_permissions(&real, std::fs::Permissions::from_mode(0o644)).expect("chmod");
    let link = d.join("link.safetensors");
    std::os::unix::fs::symlink(&real, &link).expect("symlink");
    let out = logits_to(&link);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(
        std::fs::symlink_metadata(&link).expect("link").file_type().is_symlink(),
        "link replaced"
    );
    let bytes = std::fs::read(&real).expect("read");
    let st = safetensors::SafeTensors::deserialize(&bytes).expect("safetensors");
    assert_eq!(st.tensor("logits").expect("logits").shape(), &[2, 8192]);
    assert_eq!(st.tensor("tokens").expect("tokens").data(), &[1, 0, 0, 0, 2, 0, 0, 0]);
    let mode = std::fs::metadata(&real).expect("meta").permissions().mode() & 0o777;
    assert_eq!(mode, 0o644, "permissions of the replaced file");
    // No temporary file is left beside it.
    assert_eq!(std::fs::read_dir(&d).expect("dir").count(), 2);
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn logits_output_error_names_the_users_path() {
    let d = tmp_dir("logits-missing");
    let out_path = d.join("no-such-dir").join("out.safetensors");
    let out = logits_to(&out_path);
    assert_clean_error(&out, s(&out_path));
    assert!(!String::from_utf8_lossy(&out.stderr).contains(".tmp"));
    let _ = std::fs::remove_dir_all(&d);
}

// ---------------------------------------------------------------------------------------------
// Finding 6: a FIFO as a path argument hung in open().

#[test]
fn fifo_paths_do_not_hang() {
    let d = tmp_dir("fifo");
    let fifo = d.join("model.gguf");
    mkfifo(&fifo);
    let f = s(&fifo);
    let model = fixture("tiny-dense.F16.gguf");
    let synth_out = d.join("x.gguf");
    let synth = |out: &str, from: &str| {
        [
            "synth",
            "--shape",
            "tiny-dense",
            "--quant",
            "f16",
            "-o",
            out,
            "--tokenizer-from",
            from,
        ]
        .map(String::from)
        .to_vec()
    };
    let owned = |args: &[&str]| args.iter().map(|a| a.to_string()).collect::<Vec<_>>();
    let cases = [
        (
            owned(&["info", "-m", f]),
            "is a FIFO (named pipe); a model file must be a regular file",
        ),
        (owned(&["tokenize", "-m", f, "hi"]), "is a FIFO"),
        (owned(&["run", "-m", f, "-p", "hi", "-n", "1"]), "is a FIFO"),
        (synth(f, &model), "is a FIFO"),
        (synth(s(&synth_out), f), "is a FIFO"),
    ];
    for (args, needle) in cases {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let out = rill_within(&args, Duration::from_secs(30)).unwrap_or_else(|| panic!("rill {args:?} hung on a FIFO"));
        assert_clean_error(&out, needle);
    }
    let _ = std::fs::remove_dir_all(&d);
}

// ---------------------------------------------------------------------------------------------
// Finding 7: errors that named the wrong problem.

#[test]
fn path_errors_name_the_real_problem() {
    let d = tmp_dir("paths");
    let out = rill(&["info", "-m", s(&d)]);
    assert_clean_error(&out, &format!("{}: is a directory", s(&d)));
    assert_clean_error(&rill(&["info", "-m", "/dev/zero"]), "/dev/zero: is a character device");
    assert_clean_error(&rill(&["info", "-m", "/proc/self/status"]), "has size 0");
    let empty = d.join("empty.gguf");
    std::fs::write(&empty, b"").expect("write");
    assert_clean_error(&rill(&["info", "-m", s(&empty)]), "is empty");
    // A pipe on standard input.
    let mut child = Command::new(bin())
        .args(["info", "-m", "/dev/stdin"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let stdin = child.stdin.take();
    let out = wait_within(child, Duration::from_secs(30)).expect("rill hung on a pipe");
    drop(stdin);
    assert_clean_error(&out, "is a FIFO");
    // A malformed file names the path too.
    let bad = d.join("bad.gguf");
    std::fs::write(&bad, b"GGUF\x03\x00\x00\x00").expect("write");
    assert_clean_error(&rill(&["info", "-m", s(&bad)]), &format!("{}: malformed GGUF", s(&bad)));
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn prompts_may_start_with_a_hyphen() {
    let model = fixture("tiny-dense.F16.gguf");
    let out = rill(&["tokenize", "-m", &model, "-x"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let ids: Vec<u32> = serde_json::from_slice(&out.stdout).expect("json");
    let want: Vec<u32> = serde_json::from_slice(&rill(&["tokenize", "-m", &model, "--", "-x"]).stdout).expect("json");
    assert_eq!(ids, want);
    let out = rill(&[
        "run",
        "-m",
        &model,
        "-p",
        "-x",
        "-n",
        "2",
        "--temp",
        "0",
        "--backend",
        "cpu",
    ]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let speed = format!("prompt: {} tokens", want.len());
    assert!(String::from_utf8_lossy(&out.stderr).contains(&speed));
}

// ---------------------------------------------------------------------------------------------
// Finding 8: a tokenizer smaller than the embedding ran and dropped ids.

#[test]
fn tokenizer_smaller_than_the_embedding_is_refused() {
    let shrink = |k: &str, v: &Value| {
        Some(match k {
            "tokenizer.ggml.tokens" | "tokenizer.ggml.token_type" => {
                Value::Array(v.as_array().expect("array").iter().take(8190).collect())
            }
            _ => v.clone(),
        })
    };
    let p = rewrite_fixture(
        "tiny-dense.F16.gguf",
        "hostile-small-vocab.gguf",
        shrink,
        Vec::new(),
        keep_t,
    );
    let out = rill(&["run", "-m", s(&p), "-p", "hi", "-n", "1", "--backend", "cpu"]);
    let needle = format!(
        "{}: tokenizer: the tokenizer has 8190 tokens but token_embd.weight has 8192 rows",
        s(&p)
    );
    assert_clean_error(&out, &needle);
}

//! Issue 38, chat findings 4 and 6: `rill chat` driven through stdin.
//! - `/save` replaces its file atomically (a save that fails half-way keeps the previous file) and
//!   refuses a symbolic link, a FIFO or a directory without following, blocking or replacing it.
//! - `/load` refuses a crafted state file whose checksum was recomputed (roles out of order or
//!   unknown, a NaN state, a token id past the vocabulary) and the chat goes on unchanged.
//! - A turn that fails (non-finite logits, a message longer than the context) is taken back whole:
//!   the chat goes on, the next turn works and `/save` after it writes a file that loads.
//!
//! Every run of the binary is bounded in time: a hang fails the test instead of stalling it.
#![cfg(unix)]

mod common;

use std::io::Write;
use std::os::unix::fs::FileTypeExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use common::gguf::{keep_kv, rewrite_fixture, TensorEdit};
use rill::gguf::{GgmlType, GgufFile};
use rill::tokenizer::Tokenizer;
use serde_json::Value;

const DENSE: &str = "tiny-dense.F16.gguf";
/// Far more than a run of the tiny model takes (well under a second each).
const TIMEOUT: Duration = Duration::from_secs(120);

/// A fresh directory for one test (tests run in parallel).
fn test_dir(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("rill-chat-state-{}-{tag}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("test dir");
    dir
}

fn show(p: &Path) -> String {
    p.to_string_lossy().into_owned()
}

/// What a finished `rill chat` printed.
struct Run {
    out: String,
    err: String,
}

/// `rill chat` on `model`, greedy, replies of at most 10 tokens, with `script` on stdin and `args`
/// added; killed and failed after `TIMEOUT`. `max_file_size`: the process's file size limit
/// (`RLIMIT_FSIZE`, with `SIGXFSZ` ignored so a write past it fails with `EFBIG` the way a full
/// disk fails it), a deterministic write failure that also holds for root.
fn chat(model: &Path, args: &[&str], script: &str, max_file_size: Option<u64>) -> Run {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_rill"));
    cmd.arg("chat")
        .arg("-m")
        .arg(model)
        .args(["--backend", "cpu", "--temp", "0", "--no-think", "-n", "10"])
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if let Some(limit) = max_file_size {
        // SAFETY: only async-signal-safe calls (setrlimit, signal) between fork and exec.
        unsafe {
            cmd.pre_exec(move || {
                let lim = libc::rlimit {
                    rlim_cur: limit as libc::rlim_t,
                    rlim_max: limit as libc::rlim_t,
                };
                if libc::setrlimit(libc::RLIMIT_FSIZE, &lim) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                libc::signal(libc::SIGXFSZ, libc::SIG_IGN);
                Ok(())
            });
        }
    }
    let mut child = cmd.spawn().expect("run rill chat");
    let pid = child.id();
    // The scripts are far smaller than a pipe's buffer: this never waits for the child.
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(script.as_bytes())
        .expect("write script");
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    let out = match rx.recv_timeout(TIMEOUT) {
        Ok(out) => out.expect("wait for rill chat"),
        Err(_) => {
            // SAFETY: kill(2) on the child this test started.
            unsafe { libc::kill(pid as libc::pid_t, libc::SIGKILL) };
            panic!("rill chat did not finish within {TIMEOUT:?} (hung) on script {script:?}");
        }
    };
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "rill chat failed ({}): {err}", out.status);
    assert!(!err.contains("panicked"), "{err}");
    Run {
        out: String::from_utf8_lossy(&out.stdout).into_owned(),
        err,
    }
}

fn dense() -> PathBuf {
    common::fixture(DENSE)
}

fn count(haystack: &str, needle: &str) -> usize {
    haystack.matches(needle).count()
}

fn names_in(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .expect("read dir")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

// ---- /save ----------------------------------------------------------------------------------

/// A second `/save` that fails half-way (the file size limit is the size of the first save, and
/// the second conversation is longer) leaves the first file whole: `/load` takes it back, and no
/// temporary file is left behind. Before, the failed save had already truncated the file.
#[test]
fn a_failed_save_keeps_the_previous_file_loadable() {
    let dir = test_dir("failed-save");
    let first = dir.join("first.state");
    let probe = chat(&dense(), &[], &format!("Hello there\n/save {}\n", show(&first)), None);
    assert!(probe.err.contains("[saved 2 messages"), "{}", probe.err);
    let good = std::fs::read(&first).expect("first save");
    std::fs::remove_file(&first).expect("remove");

    let file = dir.join("chat.state");
    let p = show(&file);
    let script = format!("Hello there\n/save {p}\nWhat next?\n/save {p}\n/load {p}\n/stats\n");
    let run = chat(&dense(), &[], &script, Some(good.len() as u64));
    assert_eq!(count(&run.err, "[saved 2 messages"), 1, "{}", run.err);
    assert!(
        !run.err.contains("[saved 4 messages"),
        "the second save must fail: {}",
        run.err
    );
    assert!(run.err.contains("File too large"), "{}", run.err);
    assert!(run.err.contains("[loaded 2 messages"), "{}", run.err);
    assert_eq!(std::fs::read(&file).expect("read"), good, "the first save is intact");
    assert_eq!(names_in(&dir), ["chat.state"], "no temporary file is left");
    let _ = std::fs::remove_dir_all(&dir);
}

/// `/save` onto a symbolic link, a FIFO or a directory is refused with the kind named: the link's
/// target keeps its bytes, nothing blocks on the FIFO, and the chat goes on (a later `/save` to a
/// plain path works and the replies are those of a chat without the refused saves).
#[test]
fn save_refuses_links_fifos_and_directories() {
    let dir = test_dir("special");
    let target = dir.join("victim");
    std::fs::write(&target, b"precious").expect("target");
    let link = dir.join("link.state");
    std::os::unix::fs::symlink(&target, &link).expect("symlink");
    let fifo = dir.join("fifo.state");
    let c = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).expect("c path");
    // SAFETY: `c` is a valid NUL-terminated path that outlives the call.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0, "mkfifo");
    let sub = dir.join("sub.state");
    std::fs::create_dir(&sub).expect("subdir");
    let ok = dir.join("ok.state");

    let plain = chat(&dense(), &[], "Hello there\nWhat next?\n", None);
    let script = format!(
        "Hello there\n/save {}\n/save {}\n/save {}\n/save {}\nWhat next?\n",
        show(&link),
        show(&fifo),
        show(&sub),
        show(&ok)
    );
    let run = chat(&dense(), &[], &script, None);
    for kind in ["is a symbolic link", "is a FIFO (named pipe)", "is a directory"] {
        assert!(run.err.contains(kind), "{kind}: {}", run.err);
    }
    assert_eq!(count(&run.err, "[saved 2 messages"), 1, "{}", run.err);
    assert_eq!(run.out, plain.out, "{}", run.err);
    assert_eq!(std::fs::read(&target).expect("target"), b"precious");
    assert!(std::fs::symlink_metadata(&link).expect("link").file_type().is_symlink());
    assert!(std::fs::symlink_metadata(&fifo).expect("fifo").file_type().is_fifo());
    assert!(sub.is_dir() && std::fs::read_dir(&sub).expect("subdir").next().is_none());
    assert_eq!(
        names_in(&dir),
        ["fifo.state", "link.state", "ok.state", "sub.state", "victim"]
    );
    let _ = std::fs::remove_dir_all(&dir);
}

// ---- /load of crafted files -------------------------------------------------------------------

/// A state file taken apart where a crafted one would be edited (layout: src/cache/state_file.rs):
/// the fixed header, the metadata JSON, and the layers; `to_bytes` puts it back together with the
/// length and checksum recomputed the way the writer computes them.
struct StateFile {
    /// Magic, version, model fingerprint, position: 28 bytes.
    head: Vec<u8>,
    meta: Value,
    /// Layer count, then per layer its kind byte and tensors (f32), up to the checksum.
    layers: Vec<u8>,
}

impl StateFile {
    fn parse(bytes: &[u8]) -> StateFile {
        let meta_len = u64::from_le_bytes(bytes[28..36].try_into().expect("8 bytes")) as usize;
        StateFile {
            head: bytes[..28].to_vec(),
            meta: serde_json::from_slice(&bytes[36..36 + meta_len]).expect("metadata"),
            layers: bytes[36 + meta_len..bytes.len() - 8].to_vec(),
        }
    }

    fn to_bytes(&self) -> Vec<u8> {
        let meta = serde_json::to_vec(&self.meta).expect("json");
        let mut out = self.head.clone();
        out.extend_from_slice(&(meta.len() as u64).to_le_bytes());
        out.extend_from_slice(&meta);
        out.extend_from_slice(&self.layers);
        let sum = fnv1a(&out);
        out.extend_from_slice(&sum.to_le_bytes());
        out
    }

    /// The first value of the first layer's first tensor (after the layer count and kind byte).
    fn set_first_state_value(&mut self, v: f32) {
        self.layers[5..9].copy_from_slice(&v.to_le_bytes());
    }
}

/// The state file checksum: FNV-1a, 64-bit.
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
        (h ^ b as u64).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

fn n_vocab(model: &Path) -> u64 {
    GgufFile::open(model)
        .expect("gguf")
        .tensor("token_embd.weight")
        .expect("embeddings")
        .ne[1]
}

/// Crafted files with valid checksums are refused, each with its own reason (never "checksum"),
/// and the chat goes on with its conversation unchanged: the replies equal those of a chat that
/// never tried to load them. An untouched file put back together by the same helper loads, so
/// the refusals are not the helper's doing.
#[test]
fn crafted_state_files_with_a_recomputed_checksum_are_refused() {
    let dir = test_dir("crafted");
    let saved = dir.join("saved.state");
    let first = chat(&dense(), &[], &format!("Hello there\n/save {}\n", show(&saved)), None);
    assert!(first.err.contains("[saved 2 messages"), "{}", first.err);
    let bytes = std::fs::read(&saved).expect("saved");
    let original = StateFile::parse(&bytes);
    assert_eq!(original.to_bytes(), bytes, "the helper rebuilds a saved file exactly");

    let vocab = n_vocab(&dense());
    let craft = |name: &str, edit: &dyn Fn(&mut StateFile)| -> PathBuf {
        let mut f = StateFile::parse(&bytes);
        edit(&mut f);
        let path = dir.join(name);
        std::fs::write(&path, f.to_bytes()).expect("write crafted");
        path
    };
    let untouched = craft("untouched.state", &|_| {});
    let refused: [(PathBuf, String); 6] = [
        (
            craft("order.state", &|f| {
                f.meta["messages"].as_array_mut().expect("messages").swap(0, 1)
            }),
            "message 0 is from 'assistant' where the conversation needs a user message".into(),
        ),
        (
            craft("role.state", &|f| f.meta["messages"][1]["role"] = "wizard".into()),
            "message 1 has the unknown role 'wizard'".into(),
        ),
        (
            craft("unanswered.state", &|f| {
                f.meta["messages"].as_array_mut().expect("messages").pop();
            }),
            "the conversation ends unanswered".into(),
        ),
        (
            craft("nan.state", &|f| f.set_first_state_value(f32::NAN)),
            "holds a non-finite value (NaN or infinity) at index 0".into(),
        ),
        (
            craft("inf.state", &|f| f.set_first_state_value(f32::INFINITY)),
            "holds a non-finite value (NaN or infinity) at index 0".into(),
        ),
        (
            craft("vocab.state", &|f| f.meta["tokens"][3] = vocab.into()),
            format!("token 3 is id {vocab}, outside the model's vocabulary of {vocab}"),
        ),
    ];

    let plain = chat(&dense(), &[], "Hello there\nWhat next?\n", None);
    let mut script = String::from("Hello there\n");
    for (path, _) in &refused {
        script.push_str(&format!("/load {}\n", show(path)));
    }
    script.push_str(&format!("/load {}\nWhat next?\n", show(&untouched)));
    let run = chat(&dense(), &[], &script, None);
    for (path, why) in &refused {
        let line = run
            .err
            .lines()
            .find(|l| l.contains(&*show(path)))
            .unwrap_or_else(|| panic!("no error for {}: {}", path.display(), run.err));
        assert!(line.starts_with("error: state file"), "{line}");
        assert!(line.contains(why.as_str()), "expected {why:?}: {line}");
    }
    assert!(!run.err.contains("checksum"), "{}", run.err);
    assert_eq!(
        count(&run.err, "[loaded 2 messages"),
        1,
        "only the untouched file loads: {}",
        run.err
    );
    assert_eq!(run.out, plain.out, "the conversation is unchanged: {}", run.err);
    let _ = std::fs::remove_dir_all(&dir);
}

// ---- failed turns -----------------------------------------------------------------------------

/// The tiny dense model with the embedding of `token` set to NaN: any prompt holding it makes
/// every later logit NaN, so that turn fails with non-finite logits while turns without it work.
fn poisoned_model(token: u32) -> PathBuf {
    rewrite_fixture(DENSE, "chat-state-poisoned.gguf", keep_kv, Vec::new(), |name, t| {
        if name != "token_embd.weight" {
            return Some(t);
        }
        assert_eq!(t.ty, GgmlType::F16, "fixture layout");
        let row = t.ne[0] as usize * 2;
        let mut data = t.data;
        for half in data[token as usize * row..(token as usize + 1) * row].chunks_exact_mut(2) {
            half.copy_from_slice(&0x7e00u16.to_le_bytes()); // F16 NaN
        }
        Some(TensorEdit { data, ..t })
    })
}

/// A turn that fails half-way (the model's output turns NaN) does not end the chat: the error
/// is reported, the message dropped, and the chat goes on exactly as if it had never been sent;
/// `/save` after it writes a file that loads. With the cache off (`--cache-mem 0`) only the
/// rolled-back live state can make that save consistent.
#[test]
fn a_failed_turn_keeps_the_chat_and_its_state() {
    let tok = Tokenizer::from_gguf(&GgufFile::open(dense()).expect("gguf")).expect("tokenizer");
    let poison = tok.encode("zebra", false)[0];
    for text in [
        "Hello there",
        "What next?",
        "<|im_start|>user\n<|im_end|>\n<|im_start|>assistant\n",
    ] {
        assert!(
            !tok.encode(text, true).contains(&poison),
            "{text:?} holds the poisoned token"
        );
    }
    let model = poisoned_model(poison);
    let dir = test_dir("failed-turn");
    for cache in ["2G", "0"] {
        let args = ["--cache-mem", cache];
        let plain = chat(&model, &args, "Hello there\nWhat next?\n", None);
        assert!(plain.out.len() > 4, "two replies: {:?} {}", plain.out, plain.err);
        let file = dir.join(format!("after-failure-{cache}.state"));
        let p = show(&file);
        let script = format!("Hello there\nzebra\n/save {p}\n/load {p}\nWhat next?\n/save {p}\n/load {p}\n");
        let run = chat(&model, &args, &script, None);
        assert!(
            run.err.contains("no token has a finite logit"),
            "cache {cache}: the poisoned turn fails: {}",
            run.err
        );
        assert!(run.err.contains("the conversation is kept"), "{}", run.err);
        assert_eq!(
            run.out, plain.out,
            "cache {cache}: the chat goes on as without the failed turn: {}",
            run.err
        );
        assert!(run.err.contains("[saved 2 messages"), "{}", run.err);
        assert!(run.err.contains("[loaded 2 messages"), "cache {cache}: {}", run.err);
        assert!(run.err.contains("[saved 4 messages"), "{}", run.err);
        assert!(run.err.contains("[loaded 4 messages"), "cache {cache}: {}", run.err);
    }
    let _ = std::fs::remove_file(&model);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A message longer than the context is refused without ending the chat: the next turn gets the
/// reply it gets without that message, and `/save` and `/load` after it work.
#[test]
fn a_message_longer_than_the_context_keeps_the_chat() {
    let dir = test_dir("too-long");
    let file = dir.join("after-overflow.state");
    let p = show(&file);
    let args = ["--ctx", "96"];
    let plain = chat(&dense(), &args, "Hello there\nWhat next?\n", None);
    let long = "word ".repeat(200);
    let script = format!("Hello there\n{long}\nWhat next?\n/save {p}\n/load {p}\n");
    let run = chat(&dense(), &args, &script, None);
    assert!(
        run.err.contains("no longer fits the context of 96 tokens"),
        "{}",
        run.err
    );
    assert_eq!(run.out, plain.out, "{}", run.err);
    assert!(run.err.contains("[saved 4 messages"), "{}", run.err);
    assert!(run.err.contains("[loaded 4 messages"), "{}", run.err);
    let _ = std::fs::remove_dir_all(&dir);
}

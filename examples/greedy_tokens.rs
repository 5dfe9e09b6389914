//! Greedy token ids of a chat turn as a JSON array: the reference that web/test.sh compares the
//! browser demo's tokens with (the CPU backend, the prompt `rill run --chat` builds, the same
//! stopping rule: at most N tokens, the end-of-generation token included when it comes).
//! `--raw`: the prompt as plain text, without the chat template (the page's "chat template" off).
//! `cargo run --release --example greedy_tokens -- MODEL PROMPT N [--think | --raw] [--backend B]`

use rill::backend;
use rill::exec::Model;
use rill::gguf::GgufFile;
use rill::tokenizer::{render_chat_prompt, ChatMessage, ChatOptions, Tokenizer};
use rill::{Error, Result};

fn main() {
    match run() {
        Ok(ids) => println!("{ids:?}"),
        Err(e) => {
            eprintln!("error: {e}");
            std::process::exit(1);
        }
    }
}

fn run() -> Result<Vec<u32>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let usage = || Error::InvalidArgument("usage: greedy_tokens MODEL PROMPT N [--think | --raw] [--backend B]".into());
    let [path, prompt, n, rest @ ..] = args.as_slice() else {
        return Err(usage());
    };
    let n: usize = n.parse().map_err(|_| usage())?;
    let mut think = false;
    let mut raw = false;
    let mut backend_name = "cpu".to_string();
    let mut it = rest.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--think" => think = true,
            "--raw" => raw = true,
            "--backend" => backend_name = it.next().ok_or_else(usage)?.clone(),
            _ => return Err(usage()),
        }
    }

    let file = GgufFile::open(path)?;
    let tok = Tokenizer::from_gguf(&file)?;
    let model = Model::load(&file, backend::create(&backend_name)?, &mut |_| {})?;
    let opts = ChatOptions {
        add_generation_prompt: true,
        enable_thinking: think,
    };
    let ids = if raw {
        tok.encode(prompt, false)
    } else {
        tok.encode_chat(&render_chat_prompt(
            &[ChatMessage::new("user", prompt.as_str())],
            &[],
            opts,
        )?)
        .tokens
    };
    let mut session = model.new_session(ids.len() + n)?;
    let mut out = Vec::with_capacity(n);
    let mut next = model.prefill_greedy(&mut session, &ids, &mut |_, _| {})?;
    loop {
        out.push(next);
        if tok.is_eog(next) || out.len() >= n {
            return Ok(out);
        }
        next = model.decode_greedy(&mut session, next)?;
    }
}

//! The library in a few lines: load a GGUF, prefill a prompt, sample and stream 32 tokens.
//! `cargo run --release --example generate -- tests/fixtures/tiny-dense.F16.gguf "The quick brown fox"`

use rill::backend;
use rill::exec::{Logits, Model};
use rill::gguf::GgufFile;
use rill::sample::{Sampler, SamplerConfig};
use rill::tokenizer::Tokenizer;

fn main() -> rill::Result<()> {
    let mut args = std::env::args().skip(1);
    let path = args
        .next()
        .unwrap_or_else(|| "tests/fixtures/tiny-dense.F16.gguf".into());
    let prompt = args.next().unwrap_or_else(|| "The capital of France is".into());

    let file = GgufFile::open(&path)?; // zero-copy, every size checked
    let tok = Tokenizer::from_gguf(&file)?;
    let model = Model::load(&file, backend::create("cpu")?, &mut |_bytes| {})?;
    let mut session = model.new_session(4096)?; // conv + delta state, KV cache
    let ids = tok.encode(&prompt, false);
    let logits = model.prefill(&mut session, &ids, Logits::Last, &mut |_done, _total| {})?;
    let mut sampler = Sampler::new(SamplerConfig {
        temperature: 0.7,
        seed: 1,
        ..Default::default()
    })?;
    let mut next = sampler.sample(&logits)?;
    let mut text = tok.stream_decoder(false);
    for _ in 0..32 {
        if tok.is_eog(next) {
            break;
        }
        print!("{}", text.push(next));
        next = sampler.sample(&model.decode(&mut session, next)?)?;
    }
    println!("{}", text.finish());
    Ok(())
}

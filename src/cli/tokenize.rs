//! `rill tokenize`: token ids of a text as a JSON array (works on vocab-only GGUFs too).

use std::path::PathBuf;

use clap::Args;

use crate::error::Result;
use crate::gguf::GgufFile;
use crate::tokenizer::Tokenizer;

#[derive(Args)]
pub struct TokenizeArgs {
    /// GGUF model (or vocab-only) file.
    #[arg(short, long)]
    model: PathBuf,
    /// Text to tokenize. May start with '-'.
    #[arg(allow_hyphen_values = true)]
    text: String,
    /// Treat control tokens such as <|im_start|> as plain text.
    #[arg(long)]
    no_special: bool,
}

pub fn run(a: TokenizeArgs) -> Result<()> {
    let file = GgufFile::open(&a.model)?;
    let tok = Tokenizer::from_gguf(&file).map_err(|e| e.in_model(&a.model))?;
    let ids = tok.encode(&a.text, !a.no_special);
    let parts: Vec<String> = ids.iter().map(|i| i.to_string()).collect();
    super::common::emit(&format!("[{}]\n", parts.join(", ")))
}

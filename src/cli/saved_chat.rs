//! The conversation `rill chat` keeps in a state file's metadata (`/save`, `/load`): its messages,
//! the tokens the saved state has consumed, and the thinking switch. Loading checks that a file
//! describes a conversation the chat could itself have produced, since the file's checksum only
//! tells damage apart: a crafted file with a recomputed checksum must not reach the model (an
//! unknown role would fail the next turn's template, a token id past the vocabulary would index
//! past the embeddings).

use serde_json::{json, Value};

use crate::error::StateFileError;
use crate::tokenizer::ChatMessage;

/// What a chat state file's metadata holds.
#[derive(Debug, Clone, PartialEq)]
pub struct SavedChat {
    pub messages: Vec<ChatMessage>,
    /// The tokens the saved state has consumed (as many as its positions).
    pub tokens: Vec<u32>,
    pub thinking: bool,
}

impl SavedChat {
    pub fn to_meta(&self) -> Value {
        let messages: Vec<Value> = self
            .messages
            .iter()
            .map(|m| json!({"role": m.role, "content": m.content}))
            .collect();
        json!({"messages": messages, "tokens": self.tokens, "thinking": self.thinking})
    }

    /// Read and check `meta` for a state of `pos` positions of a model with `n_vocab` tokens.
    pub fn from_meta(meta: &Value, n_vocab: usize, pos: usize) -> Result<SavedChat, StateFileError> {
        let not_chat = |what: &str| StateFileError::NotAChat(what.into());
        let messages = meta
            .get("messages")
            .and_then(Value::as_array)
            .ok_or_else(|| not_chat("no message list"))?
            .iter()
            .map(|m| {
                let role = m.get("role").and_then(Value::as_str);
                let content = m.get("content").and_then(Value::as_str);
                match (role, content) {
                    (Some(r), Some(c)) => Ok(ChatMessage::new(r, c)),
                    _ => Err(not_chat("a message without a text role and content")),
                }
            })
            .collect::<Result<Vec<_>, _>>()?;
        check_roles(&messages)?;
        let tokens = meta
            .get("tokens")
            .and_then(Value::as_array)
            .ok_or_else(|| not_chat("no token list"))?
            .iter()
            .enumerate()
            .map(|(index, t)| {
                let id = t
                    .as_u64()
                    .ok_or_else(|| not_chat("a token id that is not a whole number"))?;
                match u32::try_from(id) {
                    Ok(v) if (v as usize) < n_vocab => Ok(v),
                    _ => Err(StateFileError::TokenOutOfVocab { index, id, n_vocab }),
                }
            })
            .collect::<Result<Vec<u32>, _>>()?;
        if tokens.len() != pos {
            return Err(StateFileError::TokenCount {
                pos,
                tokens: tokens.len(),
            });
        }
        let thinking = match meta.get("thinking") {
            None => true,
            Some(v) => v
                .as_bool()
                .ok_or_else(|| not_chat("a thinking switch that is not true or false"))?,
        };
        Ok(SavedChat {
            messages,
            tokens,
            thinking,
        })
    }
}

/// The shape of every conversation `rill chat` holds between turns: an optional system message
/// first, then user and assistant messages alternating, starting with the user and ending with an
/// assistant's reply (a turn that fails is taken back whole, so a saved chat never ends waiting).
pub fn check_roles(messages: &[ChatMessage]) -> Result<(), StateFileError> {
    let start = usize::from(messages.first().is_some_and(|m| m.role == "system"));
    for (index, m) in messages.iter().enumerate() {
        if !matches!(m.role.as_str(), "system" | "user" | "assistant") {
            return Err(StateFileError::UnknownRole {
                index,
                role: m.role.clone(),
            });
        }
        if index < start {
            continue;
        }
        let expected = if (index - start) % 2 == 0 { "user" } else { "assistant" };
        if m.role != expected {
            return Err(StateFileError::RoleOrder {
                index,
                role: m.role.clone(),
                expected: if expected == "user" {
                    "a user message"
                } else {
                    "an assistant's reply"
                },
            });
        }
    }
    if (messages.len() - start) % 2 == 1 {
        return Err(StateFileError::RoleOrder {
            index: messages.len() - 1,
            role: "user".into(),
            expected: "an assistant's reply after it (the conversation ends unanswered)",
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn msgs(roles: &[&str]) -> Vec<ChatMessage> {
        roles.iter().map(|r| ChatMessage::new(*r, "text")).collect()
    }

    #[test]
    fn conversations_the_chat_produces_pass() {
        for roles in [
            &[][..],
            &["system"],
            &["user", "assistant"],
            &["system", "user", "assistant", "user", "assistant"],
        ] {
            check_roles(&msgs(roles)).unwrap_or_else(|e| panic!("{roles:?}: {e}"));
        }
    }

    #[test]
    fn unknown_roles_and_wrong_orders_are_refused() {
        let e = check_roles(&msgs(&["user", "wizard"])).expect_err("unknown");
        assert_eq!(
            e,
            StateFileError::UnknownRole {
                index: 1,
                role: "wizard".into()
            }
        );
        for roles in [
            &["assistant", "user"][..],
            &["user", "user"],
            &["user", "assistant", "system"],
            &["system", "system"],
            &["user"],
            &["user", "assistant", "user"],
            &["tool"],
        ] {
            let e = check_roles(&msgs(roles)).expect_err("refused");
            assert!(
                matches!(e, StateFileError::RoleOrder { .. } | StateFileError::UnknownRole { .. }),
                "{roles:?}: {e}"
            );
        }
    }

    #[test]
    fn token_ids_and_counts_are_checked_against_the_model() {
        let meta = |tokens: Value| json!({"messages": [], "tokens": tokens, "thinking": false});
        let ok = SavedChat::from_meta(&meta(json!([0, 9])), 10, 2).expect("valid");
        assert_eq!((ok.tokens, ok.thinking), (vec![0, 9], false));
        let e = SavedChat::from_meta(&meta(json!([0, 10])), 10, 2).expect_err("out of vocab");
        assert_eq!(
            e,
            StateFileError::TokenOutOfVocab {
                index: 1,
                id: 10,
                n_vocab: 10
            }
        );
        let e = SavedChat::from_meta(&meta(json!([0, 1u64 << 40])), 10, 2).expect_err("huge id");
        assert!(matches!(e, StateFileError::TokenOutOfVocab { index: 1, .. }), "{e}");
        let e = SavedChat::from_meta(&meta(json!([0, -1])), 10, 2).expect_err("negative");
        assert!(matches!(e, StateFileError::NotAChat(_)), "{e}");
        let e = SavedChat::from_meta(&meta(json!([0])), 10, 2).expect_err("count");
        assert_eq!(e, StateFileError::TokenCount { pos: 2, tokens: 1 });
        let e = SavedChat::from_meta(&json!({"tokens": []}), 10, 0).expect_err("no messages");
        assert!(matches!(e, StateFileError::NotAChat(_)), "{e}");
    }

    #[test]
    fn metadata_round_trips() {
        let chat = SavedChat {
            messages: msgs(&["system", "user", "assistant"]),
            tokens: vec![1, 2, 3],
            thinking: true,
        };
        assert_eq!(SavedChat::from_meta(&chat.to_meta(), 4, 3).expect("valid"), chat);
    }
}

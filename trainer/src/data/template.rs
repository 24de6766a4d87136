//! The Mistral chat template (MindSpeed-MM "mistral" = LLaMA-Factory "mistral_small"):
//! `<s>[SYSTEM_PROMPT]sys[/SYSTEM_PROMPT][INST]user[/INST]assistant</s>[INST]user[/INST]...`
//! encoded turn by turn as (source, target) pairs, the way LLaMA-Factory's supervised processor
//! does: the source (BOS, system, user) is never trained, the target (answer + EOS) is.
//!
//! `<image>` placeholders are replaced, in order over the whole conversation, by the token blocks
//! of the images. Text is always encoded as plain text: a literal `[INST]` typed by a user stays
//! text (as in mistral-common), so a dataset cannot inject control tokens.

use super::image::ImageTokens;
use super::tekken::Tekken;
use super::{DataError, Result};

/// The placeholder LLaMA-Factory / MindSpeed-MM use for an image in message text.
pub const IMAGE_PLACEHOLDER: &str = "<image>";

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    System,
    User,
    Assistant,
}

#[derive(Debug, Clone, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
pub struct Message {
    pub role: Role,
    pub content: String,
}

/// Ids of the control tokens the template and the image blocks use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SpecialIds {
    pub bos: u32,
    pub eos: u32,
    pub pad: u32,
    pub inst: u32,
    pub inst_end: u32,
    pub system: u32,
    pub system_end: u32,
    pub image: ImageTokens,
}

impl SpecialIds {
    /// Reads the ids from the tokenizer's special token list.
    pub fn from_tekken(t: &Tekken) -> Result<Self> {
        let id = |s: &str| {
            t.special_id(s)
                .ok_or_else(|| DataError::Config(format!("tokenizer lacks {s}")))
        };
        Ok(SpecialIds {
            bos: id("<s>")?,
            eos: id("</s>")?,
            pad: id("<pad>")?,
            inst: id("[INST]")?,
            inst_end: id("[/INST]")?,
            system: id("[SYSTEM_PROMPT]")?,
            system_end: id("[/SYSTEM_PROMPT]")?,
            image: ImageTokens {
                img: id("[IMG]")?,
                img_break: id("[IMG_BREAK]")?,
                img_end: id("[IMG_END]")?,
            },
        })
    }
}

/// Checks the order of roles: an optional system message first, then user/assistant
/// alternating, ending with an assistant answer.
pub fn check_roles(messages: &[Message]) -> std::result::Result<(), String> {
    let body = match messages.first() {
        Some(m) if m.role == Role::System => &messages[1..],
        _ => messages,
    };
    if body.is_empty() {
        return Err("no user/assistant messages".into());
    }
    for (i, m) in body.iter().enumerate() {
        let want = if i % 2 == 0 {
            Role::User
        } else {
            Role::Assistant
        };
        if m.role != want {
            return Err(format!(
                "message {} is {:?}, expected {want:?} (roles must be [system] user assistant ...)",
                i + messages.len() - body.len(),
                m.role
            ));
        }
    }
    if body.len() % 2 != 0 {
        return Err("the conversation does not end with an assistant answer".into());
    }
    Ok(())
}

/// Number of `<image>` placeholders in the conversation.
pub fn count_placeholders(messages: &[Message]) -> usize {
    messages
        .iter()
        .map(|m| m.content.matches(IMAGE_PLACEHOLDER).count())
        .sum()
}

/// One turn: the prompt part (labels IGNORE_INDEX) and the answer part (trained).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Turn {
    pub source: Vec<u32>,
    pub target: Vec<u32>,
}

/// Encodes a conversation whose roles passed [`check_roles`] into turns. `system` is used when
/// the conversation brings no system message; `image_blocks[k]` replaces the k-th placeholder.
pub fn encode_turns(
    tok: &Tekken,
    ids: &SpecialIds,
    messages: &[Message],
    system: Option<&str>,
    image_blocks: &[Vec<u32>],
) -> Vec<Turn> {
    let mut blocks = image_blocks.iter();
    let mut encode = |text: &str, out: &mut Vec<u32>| {
        let mut parts = text.split(IMAGE_PLACEHOLDER);
        if let Some(first) = parts.next() {
            tok.encode_into(first, out);
        }
        for part in parts {
            if let Some(b) = blocks.next() {
                out.extend_from_slice(b);
            }
            tok.encode_into(part, out);
        }
    };
    let (sys, body) = match messages.first() {
        Some(m) if m.role == Role::System => (Some(m.content.as_str()), &messages[1..]),
        _ => (system, messages),
    };
    let mut turns = Vec::with_capacity(body.len() / 2);
    for (k, pair) in body.chunks(2).enumerate() {
        let mut t = Turn::default();
        if k == 0 {
            t.source.push(ids.bos);
            if let Some(s) = sys {
                t.source.push(ids.system);
                encode(s, &mut t.source);
                t.source.push(ids.system_end);
            }
        }
        t.source.push(ids.inst);
        encode(&pair[0].content, &mut t.source);
        t.source.push(ids.inst_end);
        if let Some(answer) = pair.get(1) {
            encode(&answer.content, &mut t.target);
            t.target.push(ids.eos);
        }
        turns.push(t);
    }
    turns
}

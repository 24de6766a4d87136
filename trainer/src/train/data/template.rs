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

/// Checks the order of roles: turns of `system* user assistant`, at least one, ending with an
/// assistant answer. A system message may open the conversation (LLaMA-Factory's only place for
/// it) or precede any later user message (mistral-common encodes it in place there).
pub fn check_roles(messages: &[Message]) -> std::result::Result<(), String> {
    let mut want_answer = false;
    let mut turns = 0;
    for (i, m) in messages.iter().enumerate() {
        let ok = match m.role {
            Role::System | Role::User => !want_answer,
            Role::Assistant => want_answer,
        };
        if !ok {
            let want = if want_answer {
                "Assistant"
            } else {
                "User (or System)"
            };
            return Err(format!(
                "message {i} is {:?}, expected {want} (roles must be [system] user assistant ...)",
                m.role
            ));
        }
        match m.role {
            Role::System => {}
            Role::User => want_answer = true,
            Role::Assistant => {
                want_answer = false;
                turns += 1;
            }
        }
    }
    if want_answer {
        return Err("the conversation does not end with an assistant answer".into());
    }
    if turns == 0 {
        return Err("no user/assistant messages".into());
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

/// Encodes a conversation into turns (one per assistant answer; a trailing prompt becomes a last
/// turn without target). Training data passes [`check_roles`] first. `system` is used when
/// the conversation does not open with a system message; `image_blocks[k]` replaces the k-th
/// placeholder.
///
/// As mistral-common's `InstructTokenizerV7`: every system message is
/// `[SYSTEM_PROMPT]text[/SYSTEM_PROMPT]` in its place (so it belongs to the source of the turn
/// it precedes), and an answer loses its trailing spaces (`content.rstrip(" ")`) before EOS.
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
    let opens_with_system = messages.first().is_some_and(|m| m.role == Role::System);
    let mut turns = Vec::with_capacity(messages.len() / 2);
    let mut t = Turn::default();
    t.source.push(ids.bos);
    if let (false, Some(s)) = (opens_with_system, system) {
        t.source.push(ids.system);
        encode(s, &mut t.source);
        t.source.push(ids.system_end);
    }
    for m in messages {
        match m.role {
            Role::System => {
                t.source.push(ids.system);
                encode(&m.content, &mut t.source);
                t.source.push(ids.system_end);
            }
            Role::User => {
                t.source.push(ids.inst);
                encode(&m.content, &mut t.source);
                t.source.push(ids.inst_end);
            }
            Role::Assistant => {
                encode(m.content.trim_end_matches(' '), &mut t.target);
                t.target.push(ids.eos);
                turns.push(std::mem::take(&mut t));
            }
        }
    }
    // A conversation that ends in a prompt (what generation starts from) keeps it as a last
    // turn with an empty target.
    if messages.last().is_some_and(|m| m.role != Role::Assistant) {
        turns.push(t);
    }
    turns
}

//! The Mistral chat template (MindSpeed-MM "mistral" = LLaMA-Factory "mistral_small"):
//! `<s>[SYSTEM_PROMPT]sys[/SYSTEM_PROMPT][INST]user[/INST]assistant</s>[INST]user[/INST]...`
//! encoded turn by turn as (source, target) pairs, the way LLaMA-Factory's supervised processor
//! does: the source (BOS, system, user) is never trained, the target (answer + EOS) is.
//!
//! The ids are mistral-common's `InstructTokenizerV13.encode_instruct` of the same conversation
//! (`../shared/reference/chat` holds its encodings; `tests/data_chat.rs` compares): `<image>`
//! placeholders are replaced, in order over the whole conversation, by the token blocks of the
//! images, each piece of text between them encoded on its own; a user turn of text followed by
//! one image at its end puts the image first (mistral-common's `_maybe_put_image_first`); an
//! answer that opens with `<think>...</think>` (LLaMA-Factory's convention) or carries a
//! `reasoning_content` is `[THINK]thinking[/THINK]answer` when the tokenizer has those tokens.
//! Text from a dataset is always encoded as plain text: a literal `[INST]` typed by a user stays
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
    /// An answer's thinking given apart from its text (the OpenAI-style `reasoning_content`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning: Option<String>,
}

impl Message {
    pub fn new(role: Role, content: impl Into<String>) -> Self {
        Message {
            role,
            content: content.into(),
            reasoning: None,
        }
    }
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
    /// `[THINK]` and `[/THINK]`, when the tokenizer has them (v13 files).
    pub think: Option<(u32, u32)>,
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
            think: t.special_id("[THINK]").zip(t.special_id("[/THINK]")),
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

/// An answer's thinking and text: `reasoning` if given, else an opening `<think>...</think>`
/// (mistral-common's reference split: `<think>(.*?)</think>(.*)` matched at the very start).
pub fn split_thinking(m: &Message) -> Option<(&str, &str)> {
    if let Some(r) = &m.reasoning {
        return Some((r.as_str(), m.content.as_str()));
    }
    let rest = m.content.strip_prefix("<think>")?;
    let end = rest.find("</think>")?;
    Some((&rest[..end], &rest[end + "</think>".len()..]))
}

/// A system prompt set for the run (`data.system`, or the model folder's SYSTEM_PROMPT.txt):
/// its text, with a `[THINK]...[/THINK]` span in it encoded as the think tokens (Magistral's
/// prompt describes its answer format that way, and its model card loads the file as a
/// text / thinking / text message). A system message of a dataset stays plain text.
pub fn encode_run_system(tok: &Tekken, ids: &SpecialIds, text: &str, out: &mut Vec<u32>) {
    let span = ids.think.and_then(|think| {
        let a = text.find("[THINK]")?;
        let b = a + text[a..].find("[/THINK]")?;
        Some((think, a, b))
    });
    match span {
        Some(((open, close), a, b)) => {
            tok.encode_into(&text[..a], out);
            out.push(open);
            tok.encode_into(&text[a + "[THINK]".len()..b], out);
            out.push(close);
            tok.encode_into(&text[b + "[/THINK]".len()..], out);
        }
        None => tok.encode_into(text, out),
    }
}

/// Encodes a conversation into turns (one per assistant answer; a trailing prompt becomes a last
/// turn without target). Training data passes [`check_roles`] first. `system` (the run's, see
/// [`encode_run_system`]) is used when the conversation does not open with a system message;
/// `image_blocks[k]` replaces the k-th placeholder.
///
/// As mistral-common's `InstructTokenizerV13`: every system message is
/// `[SYSTEM_PROMPT]text[/SYSTEM_PROMPT]` in its place (so it belongs to the source of the turn
/// it precedes); a plain answer loses its trailing spaces (`content.rstrip(" ")`) before EOS,
/// an answer with thinking (content chunks there) keeps them.
pub fn encode_turns(
    tok: &Tekken,
    ids: &SpecialIds,
    messages: &[Message],
    system: Option<&str>,
    image_blocks: &[Vec<u32>],
) -> Vec<Turn> {
    let mut blocks = image_blocks.iter();
    let mut user = |text: &str, out: &mut Vec<u32>| {
        // `[text, image]`: the image goes first (mistral-common, "img is always first when
        // providing text/img chunk pair").
        if let Some(head) = text.strip_suffix(IMAGE_PLACEHOLDER) {
            if !head.is_empty() && !head.contains(IMAGE_PLACEHOLDER) {
                if let Some(b) = blocks.next() {
                    out.extend_from_slice(b);
                }
                tok.encode_into(head, out);
                return;
            }
        }
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
        encode_run_system(tok, ids, s, &mut t.source);
        t.source.push(ids.system_end);
    }
    for m in messages {
        match m.role {
            Role::System => {
                t.source.push(ids.system);
                tok.encode_into(&m.content, &mut t.source);
                t.source.push(ids.system_end);
            }
            Role::User => {
                t.source.push(ids.inst);
                user(&m.content, &mut t.source);
                t.source.push(ids.inst_end);
            }
            Role::Assistant => {
                encode_answer(tok, ids, m, &mut t.target);
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

/// An answer without its EOS: `[THINK]thinking[/THINK]text` when it has thinking and the
/// tokenizer the think tokens; without those tokens the thinking stays text, written back as
/// `<think>...</think>` before the answer (nothing the dataset holds is dropped).
fn encode_answer(tok: &Tekken, ids: &SpecialIds, m: &Message, out: &mut Vec<u32>) {
    match (split_thinking(m), ids.think) {
        (Some((thinking, text)), Some((open, close))) => {
            out.push(open);
            tok.encode_into(thinking, out);
            out.push(close);
            tok.encode_into(text, out);
        }
        (Some((thinking, text)), None) if m.reasoning.is_some() => {
            let whole = format!("<think>{thinking}</think>{text}");
            tok.encode_into(whole.trim_end_matches(' '), out);
        }
        _ => tok.encode_into(m.content.trim_end_matches(' '), out),
    }
}

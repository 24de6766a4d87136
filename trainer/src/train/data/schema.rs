//! How one dataset record (a JSON object) becomes a conversation: LLaMA-Factory's two
//! formattings and their column and tag mapping (`dataset_info.json`, see [`super::info`]).
//!
//! - `sharegpt`: a list of messages under the `messages` column (default `conversations`), each
//!   an object whose `role_tag` key (default `from`) says who speaks and whose `content_tag` key
//!   (default `value`) holds the text; the role values are `user_tag` (`human`), `assistant_tag`
//!   (`gpt`) and `system_tag` (`system`). The OpenAI layout (`messages` of `role`/`content` with
//!   `user`/`assistant`/`system`) is this formatting with other tags.
//! - `alpaca`: `instruction` + `\n` + `input` is the prompt, `output` the answer, `history` a list
//!   of earlier `[prompt, answer]` pairs (trained too), `system` a system prompt.
//!
//! Both may name an `images` column (a list of paths, or one path) and a `system` column.
//! Without a `dataset_info.json` the schema is guessed per record ([`Schema::Auto`]).

use super::template::{Message, Role};
use serde_json::{Map, Value};

/// LLaMA-Factory `formatting`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Formatting {
    Alpaca,
    Sharegpt,
}

/// Column names (LLaMA-Factory `columns`): `None` means the column is not read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Columns {
    pub messages: Option<String>,
    pub images: Option<String>,
    pub system: Option<String>,
    pub prompt: Option<String>,
    pub query: Option<String>,
    pub response: Option<String>,
    pub history: Option<String>,
}

/// Role tags of the sharegpt formatting (LLaMA-Factory `tags`): `None` means no message can
/// carry that role.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tags {
    pub role_tag: Option<String>,
    pub content_tag: Option<String>,
    pub user_tag: Option<String>,
    pub assistant_tag: Option<String>,
    pub system_tag: Option<String>,
    pub observation_tag: Option<String>,
    pub function_tag: Option<String>,
}

fn some(s: &str) -> Option<String> {
    Some(s.to_string())
}

impl Default for Columns {
    /// LLaMA-Factory's `DatasetAttr` defaults (no `columns` given).
    fn default() -> Self {
        Columns {
            messages: some("conversations"),
            images: None,
            system: None,
            prompt: some("instruction"),
            query: some("input"),
            response: some("output"),
            history: None,
        }
    }
}

impl Default for Tags {
    /// LLaMA-Factory's `DatasetAttr` defaults (no `tags` given): ShareGPT's spelling.
    fn default() -> Self {
        Tags {
            role_tag: some("from"),
            content_tag: some("value"),
            user_tag: some("human"),
            assistant_tag: some("gpt"),
            system_tag: some("system"),
            observation_tag: some("observation"),
            function_tag: some("function_call"),
        }
    }
}

impl Tags {
    /// The OpenAI spelling: `role`/`content` with `user`/`assistant`/`system`.
    pub fn openai() -> Self {
        Tags {
            role_tag: some("role"),
            content_tag: some("content"),
            user_tag: some("user"),
            assistant_tag: some("assistant"),
            system_tag: some("system"),
            ..Tags::default()
        }
    }
}

/// A mapped schema: what a `dataset_info.json` entry says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mapped {
    pub formatting: Formatting,
    pub columns: Columns,
    pub tags: Tags,
}

/// How records are read.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Schema {
    /// Guessed per record: a `messages` list of `role`/`content` objects (OpenAI spelling) or a
    /// `conversations` list of `from`/`value` objects (ShareGPT spelling), with optional `images`
    /// and `system` keys.
    #[default]
    Auto,
    Mapped(Box<Mapped>),
}

/// A record turned into messages, the image paths as written, and its own system prompt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Conversation {
    pub messages: Vec<Message>,
    pub images: Vec<String>,
    pub system: Option<String>,
}

/// Why a record cannot be read (becomes a bad-record report).
type Why = String;

impl Schema {
    /// Reads one record. The roles are not checked here (see `template::check_roles`).
    pub fn conversation(&self, record: &Value) -> Result<Conversation, Why> {
        let obj = record
            .as_object()
            .ok_or_else(|| format!("a sample must be a JSON object, found {}", kind(record)))?;
        match self {
            Schema::Auto => {
                let (column, tags) = if obj.contains_key("messages") {
                    ("messages", Tags::openai())
                } else if obj.contains_key("conversations") {
                    ("conversations", Tags::default())
                } else {
                    return Err(
                        "no `messages` or `conversations` list (a dataset in another \
                                layout needs a dataset_info.json entry)"
                            .into(),
                    );
                };
                Ok(Conversation {
                    messages: sharegpt_messages(obj, column, &tags)?,
                    images: images(obj, Some("images"))?,
                    system: text_column(obj, Some("system"))?,
                })
            }
            Schema::Mapped(m) => {
                let messages = match m.formatting {
                    Formatting::Sharegpt => {
                        let col = m.columns.messages.as_deref().ok_or(
                            "the dataset_info entry names no `messages` column".to_string(),
                        )?;
                        sharegpt_messages(obj, col, &m.tags)?
                    }
                    Formatting::Alpaca => alpaca_messages(obj, &m.columns)?,
                };
                Ok(Conversation {
                    messages,
                    images: images(obj, m.columns.images.as_deref())?,
                    system: text_column(obj, m.columns.system.as_deref())?,
                })
            }
        }
    }
}

fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// A string column; absent or null reads as none.
fn text_column(obj: &Map<String, Value>, col: Option<&str>) -> Result<Option<String>, Why> {
    match col.and_then(|c| obj.get(c).map(|v| (c, v))) {
        None | Some((_, Value::Null)) => Ok(None),
        Some((_, Value::String(s))) => Ok(Some(s.clone())),
        Some((c, v)) => Err(format!("`{c}` must be a string, found {}", kind(v))),
    }
}

/// The images column: a list of paths or one path (LLaMA-Factory wraps a single one).
fn images(obj: &Map<String, Value>, col: Option<&str>) -> Result<Vec<String>, Why> {
    let Some((c, v)) = col.and_then(|c| obj.get(c).map(|v| (c, v))) else {
        return Ok(Vec::new());
    };
    match v {
        Value::Null => Ok(Vec::new()),
        Value::String(s) => Ok(vec![s.clone()]),
        Value::Array(a) => a
            .iter()
            .enumerate()
            .map(|(i, p)| match p {
                Value::String(s) => Ok(s.clone()),
                other => Err(format!(
                    "`{c}`[{i}] must be a path string, found {}",
                    kind(other)
                )),
            })
            .collect(),
        other => Err(format!(
            "`{c}` must be a list of image paths, found {}",
            kind(other)
        )),
    }
}

fn sharegpt_messages(
    obj: &Map<String, Value>,
    column: &str,
    tags: &Tags,
) -> Result<Vec<Message>, Why> {
    let list = match obj.get(column) {
        Some(Value::Array(a)) => a,
        Some(other) => return Err(format!("`{column}` must be a list, found {}", kind(other))),
        None => return Err(format!("no `{column}` list")),
    };
    let role_tag = tags
        .role_tag
        .as_deref()
        .ok_or("the dataset_info tags name no `role_tag`")?;
    let content_tag = tags
        .content_tag
        .as_deref()
        .ok_or("the dataset_info tags name no `content_tag`")?;
    let roles = [
        (&tags.user_tag, Role::User),
        (&tags.assistant_tag, Role::Assistant),
        (&tags.system_tag, Role::System),
    ];
    let mut out = Vec::with_capacity(list.len());
    for (i, m) in list.iter().enumerate() {
        let m = m
            .as_object()
            .ok_or_else(|| format!("{column}[{i}] must be an object, found {}", kind(m)))?;
        let role = match m.get(role_tag) {
            Some(Value::String(s)) => s.as_str(),
            _ => return Err(format!("{column}[{i}] has no string `{role_tag}`")),
        };
        let Some(&(_, r)) = roles.iter().find(|(t, _)| t.as_deref() == Some(role)) else {
            let tools = [&tags.observation_tag, &tags.function_tag];
            if tools.iter().any(|t| t.as_deref() == Some(role)) {
                return Err(format!(
                    "{column}[{i}]: `{role}` messages (tool calls and results) are not supported"
                ));
            }
            let known: Vec<String> = roles
                .iter()
                .filter_map(|(t, r)| t.as_ref().map(|t| format!("`{t}` ({r:?})")))
                .collect();
            return Err(format!(
                "{column}[{i}]: unknown {role_tag} `{role}` (known: {})",
                known.join(", ")
            ));
        };
        let content = match m.get(content_tag) {
            Some(Value::String(s)) => s.clone(),
            Some(other) => {
                return Err(format!(
                    "{column}[{i}].{content_tag} must be a string, found {}",
                    kind(other)
                ))
            }
            None => return Err(format!("{column}[{i}] has no `{content_tag}`")),
        };
        // The OpenAI-style separate thinking of an answer (what reasoning datasets carry).
        let reasoning = match m.get("reasoning_content") {
            None | Some(Value::Null) => None,
            Some(Value::String(s)) if r == Role::Assistant => Some(s.clone()),
            Some(Value::String(_)) => {
                return Err(format!(
                    "{column}[{i}]: only an assistant message can carry `reasoning_content`"
                ))
            }
            Some(other) => {
                return Err(format!(
                    "{column}[{i}].reasoning_content must be a string, found {}",
                    kind(other)
                ))
            }
        };
        out.push(Message {
            role: r,
            content,
            reasoning,
        });
    }
    Ok(out)
}

/// LLaMA-Factory's `AlpacaDatasetConverter`: history pairs, then `prompt\nquery` (empty parts
/// left out) and the response.
fn alpaca_messages(obj: &Map<String, Value>, c: &Columns) -> Result<Vec<Message>, Why> {
    let mut out = Vec::new();
    if let Some((col, h)) = c
        .history
        .as_deref()
        .and_then(|k| obj.get(k).map(|v| (k, v)))
    {
        let bad = || format!("`{col}` must be a list of [prompt, answer] string pairs");
        match h {
            Value::Null => {}
            Value::Array(pairs) => {
                for p in pairs {
                    let [Value::String(q), Value::String(a)] =
                        p.as_array().map(Vec::as_slice).ok_or_else(bad)?
                    else {
                        return Err(bad());
                    };
                    out.push(Message::new(Role::User, q.clone()));
                    out.push(Message::new(Role::Assistant, a.clone()));
                }
            }
            _ => return Err(bad()),
        }
    }
    let mut query = Vec::new();
    for col in [&c.prompt, &c.query] {
        if let Some(t) = text_column(obj, col.as_deref())? {
            if !t.is_empty() {
                query.push(t);
            }
        }
    }
    out.push(Message::new(Role::User, query.join("\n")));
    match text_column(obj, c.response.as_deref())? {
        Some(a) => out.push(Message::new(Role::Assistant, a)),
        None => {
            let col = c.response.as_deref().unwrap_or("response");
            return Err(format!("no `{col}` answer"));
        }
    }
    Ok(out)
}

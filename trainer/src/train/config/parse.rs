//! Reading a configuration: a TOML file parsed one section at a time (so that an error names
//! its section and key), `--set section.key=value` overrides applied to the parsed table,
//! then [`TrainConfig::validate`].

use super::{ConfigError, TrainConfig, SECTIONS};
use std::path::Path;

impl TrainConfig {
    /// Reads `file` (None: the defaults), applies the `--set section.key=value` overrides in
    /// order and validates the result.
    pub fn load(file: Option<&Path>, sets: &[String]) -> Result<Self, ConfigError> {
        let (mut table, origin) = match file {
            Some(p) => {
                let text = crate::bounded::read_to_string_capped(p, crate::bounded::MAX_SMALL_FILE)
                    .map_err(|source| ConfigError::Io {
                        path: p.to_path_buf(),
                        source,
                    })?;
                (
                    parse_table(&text, &p.display().to_string())?,
                    p.display().to_string(),
                )
            }
            None => (toml::Table::new(), "the built-in defaults".to_string()),
        };
        // Parse the file alone first, so that its own mistakes are reported against it.
        from_table(table.clone(), &origin)?;
        for arg in sets {
            apply_override(&mut table, arg)?;
        }
        let origin = if sets.is_empty() {
            origin
        } else {
            format!("{origin} with --set overrides")
        };
        let cfg = from_table(table, &origin)?;
        cfg.validate()?;
        Ok(cfg)
    }

    /// Parses and validates a TOML document.
    pub fn from_toml(text: &str) -> Result<Self, ConfigError> {
        let cfg = from_table(parse_table(text, "<string>")?, "<string>")?;
        cfg.validate()?;
        Ok(cfg)
    }

    /// The configuration as TOML (what `config.toml` in the run folder holds); reading it back
    /// gives the same configuration.
    pub fn to_toml(&self) -> String {
        toml::to_string(self).unwrap_or_else(|e| format!("# cannot write the config: {e}\n"))
    }
}

fn parse_table(text: &str, origin: &str) -> Result<toml::Table, ConfigError> {
    text.parse::<toml::Table>().map_err(|e| ConfigError::Parse {
        origin: origin.to_string(),
        message: e.to_string().trim_end().to_string(),
    })
}

/// Deserializes one section at a time, so that an error names its section as well as the key
/// serde reports (serde's messages name the field but not where it sits).
fn from_table(table: toml::Table, origin: &str) -> Result<TrainConfig, ConfigError> {
    let err = |message: String| ConfigError::Parse {
        origin: origin.to_string(),
        message,
    };
    for (name, value) in &table {
        if !SECTIONS.contains(&name.as_str()) {
            return Err(err(format!(
                "unknown section [{name}] (sections: {})",
                SECTIONS.join(", ")
            )));
        }
        if !value.is_table() {
            return Err(err(format!("[{name}] must be a table of keys")));
        }
    }
    fn section<T: serde::de::DeserializeOwned + Default>(
        table: &toml::Table,
        name: &str,
    ) -> Result<T, String> {
        match table.get(name) {
            None => Ok(T::default()),
            Some(v) => v
                .clone()
                .try_into::<T>()
                .map_err(|e| name_the_key(name, e.to_string().trim_end())),
        }
    }
    Ok(TrainConfig {
        model: section(&table, "model").map_err(err)?,
        data: section(&table, "data").map_err(err)?,
        train: section(&table, "train").map_err(err)?,
        parallel: section(&table, "parallel").map_err(err)?,
        checkpoint: section(&table, "checkpoint").map_err(err)?,
        log: section(&table, "log").map_err(err)?,
    })
}

/// Rewrites serde's message about a key of `[section]` so that it starts with the dotted key:
/// toml reports a bad value as "message\nin `key`" and an unknown key as "unknown field `key`,
/// expected one of ...".
fn name_the_key(section: &str, msg: &str) -> String {
    if let Some(rest) = msg.strip_prefix("unknown field `") {
        if let Some((key, expected)) = rest.split_once('`') {
            let expected = expected.trim_start_matches(',').trim();
            return format!("{section}.{key}: unknown key ({expected})");
        }
    }
    if let Some((what, key)) = msg.rsplit_once("\nin `") {
        let key = key.trim_end_matches('`');
        return format!("{section}.{key}: {}", what.trim());
    }
    format!("[{section}]: {msg}")
}

/// Applies one `section.key=value`: the value is read as a TOML value (`3e-4`, `true`,
/// `[0.9, 0.95]`, `"text"`), and as a plain string when it is not one (`data.dataset=a/b.json`).
fn apply_override(table: &mut toml::Table, arg: &str) -> Result<(), ConfigError> {
    let bad = |reason: String| ConfigError::Override {
        arg: arg.to_string(),
        reason,
    };
    let (key, raw) = arg
        .split_once('=')
        .ok_or_else(|| bad("expected section.key=value".into()))?;
    let (sec, field) = key
        .trim()
        .split_once('.')
        .ok_or_else(|| bad("the key must be section.key, e.g. train.lr".into()))?;
    if !SECTIONS.contains(&sec) {
        return Err(bad(format!(
            "unknown section {sec:?} (sections: {})",
            SECTIONS.join(", ")
        )));
    }
    if field.is_empty() || field.contains('.') {
        return Err(bad("the key must be section.key, e.g. train.lr".into()));
    }
    let raw = raw.trim();
    let value = format!("v = {raw}")
        .parse::<toml::Table>()
        .ok()
        .and_then(|mut t| t.remove("v"))
        .unwrap_or_else(|| toml::Value::String(raw.to_string()));
    let entry = table
        .entry(sec.to_string())
        .or_insert_with(|| toml::Value::Table(toml::Table::new()));
    let toml::Value::Table(section) = entry else {
        return Err(bad(format!("[{sec}] is not a table in the config file")));
    };
    section.insert(field.to_string(), value);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A run config is kilobytes: one past the small-file cap (a sparse file: nothing is
    /// written) is refused by its size, naming it, before it is read.
    #[test]
    fn a_config_file_past_the_cap_is_refused_unread() {
        let dir = std::env::temp_dir().join(format!("cannon-toml-cap-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("huge.toml");
        let f = std::fs::File::create(&p).unwrap();
        f.set_len(crate::bounded::MAX_SMALL_FILE + 1).unwrap();
        drop(f);
        let e = TrainConfig::load(Some(&p), &[]).unwrap_err().to_string();
        assert!(e.contains("huge.toml") && e.contains("the largest"), "{e}");
        std::fs::remove_dir_all(&dir).ok();
    }
}

//! Settings resolution: flag > environment > config file > default.
//!
//! The config file (`--config FILE` or `BERTH_CONFIG`) holds `KEY=VALUE` lines whose keys
//! are the environment variable names (`BERTH_LISTEN=…`, `DATABASE_URL=…`); `#` starts a
//! comment. See `ops/berth.conf.example`.

use std::{collections::HashMap, path::Path};

use anyhow::Context;

#[derive(Clone)]
pub struct Settings {
    file: HashMap<String, String>,
    /// Variables taken out of the environment at start (`seal`): read as the environment.
    sealed: crate::seal::Sealed,
    /// The config file read (re-read on reload).
    pub path: Option<std::path::PathBuf>,
}

impl Settings {
    pub fn load(path: Option<&Path>, sealed: crate::seal::Sealed) -> anyhow::Result<Settings> {
        let path = path
            .map(Path::to_path_buf)
            .or_else(|| std::env::var_os("BERTH_CONFIG").map(Into::into));
        let mut file = HashMap::new();
        if let Some(path) = &path {
            let text =
                std::fs::read_to_string(path).with_context(|| format!("reading config file {}", path.display()))?;
            for (n, line) in text.lines().enumerate() {
                let line = line.trim();
                if line.is_empty() || line.starts_with('#') {
                    continue;
                }
                let (k, v) = line
                    .split_once('=')
                    .with_context(|| format!("{}:{}: expected KEY=VALUE", path.display(), n + 1))?;
                file.insert(k.trim().to_string(), v.trim().trim_matches('"').to_string());
            }
        }
        Ok(Settings { file, sealed, path })
    }

    /// The same settings with the config file read again.
    pub fn reloaded(&self) -> anyhow::Result<Settings> {
        Settings::load(self.path.as_deref(), self.sealed.clone())
    }

    /// The value of `key`: the flag if given, else the environment, else the file.
    pub fn get(&self, flag: Option<&str>, key: &str) -> Option<String> {
        flag.map(str::to_string)
            .or_else(|| std::env::var(key).ok().filter(|v| !v.is_empty()))
            .or_else(|| self.sealed.get(key).cloned().filter(|v| !v.is_empty()))
            .or_else(|| self.file.get(key).cloned().filter(|v| !v.is_empty()))
    }

    /// Every setting whose key starts with `prefix` (environment over file).
    pub fn with_prefix(&self, prefix: &str) -> Vec<(String, String)> {
        let mut out: std::collections::BTreeMap<String, String> = self
            .file
            .iter()
            .filter(|(k, v)| k.starts_with(prefix) && !v.is_empty())
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        let sealed = self.sealed.iter().map(|(k, v)| (k.clone(), v.clone()));
        out.extend(
            sealed
                .chain(std::env::vars())
                .filter(|(k, v)| k.starts_with(prefix) && !v.is_empty()),
        );
        out.into_iter().collect()
    }

    /// A secret given directly (`KEY`) or by file (`KEY_FILE`).
    pub fn secret(&self, key: &str) -> anyhow::Result<Option<String>> {
        if let Some(v) = self.get(None, key) {
            return Ok(Some(v));
        }
        match self.get(None, &format!("{key}_FILE")) {
            Some(path) => Ok(Some(
                std::fs::read_to_string(&path)
                    .with_context(|| format!("reading {key}_FILE ({path})"))?
                    .trim()
                    .to_string(),
            )),
            None => Ok(None),
        }
    }

    /// Parse a setting, naming the variable in the error.
    pub fn parse<T: std::str::FromStr>(&self, flag: Option<&str>, key: &str, default: &str) -> anyhow::Result<T>
    where
        T::Err: std::fmt::Display,
    {
        let raw = self.get(flag, key).unwrap_or_else(|| default.to_string());
        raw.parse()
            .map_err(|e| anyhow::anyhow!("{key}={raw:?} is invalid: {e}"))
    }
}

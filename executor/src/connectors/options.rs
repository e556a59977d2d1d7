//! A connector's `WITH` options as it reads them: every option must be
//! taken by name, and what is left over is an error naming the options the
//! connector has.

use std::collections::BTreeMap;
use std::str::FromStr;

use crate::{ExecError, Result};

/// The options of one connector, consumed as they are read.
#[derive(Debug)]
pub struct Options {
    connector: String,
    left: BTreeMap<String, String>,
}

impl Options {
    pub fn new(connector: &str, options: &BTreeMap<String, String>) -> Self {
        Self {
            connector: connector.to_string(),
            left: options.clone(),
        }
    }

    /// Takes option `name`, if given.
    pub fn take(&mut self, name: &str) -> Option<String> {
        self.left.remove(name)
    }

    /// Takes option `name` and parses it; `what` says what it must be.
    pub fn parse<T: FromStr>(&mut self, name: &str, what: &str) -> Result<Option<T>> {
        match self.take(name) {
            None => Ok(None),
            Some(v) => v.trim().parse().map(Some).map_err(|_| {
                ExecError::InvalidOption(format!(
                    "option {name} of connector {} must be {what}, not '{v}'",
                    self.connector
                ))
            }),
        }
    }

    /// Takes a boolean option (`true`/`false`).
    pub fn flag(&mut self, name: &str) -> Result<Option<bool>> {
        match self.take(name) {
            None => Ok(None),
            Some(v) => match v.trim().to_ascii_lowercase().as_str() {
                "true" => Ok(Some(true)),
                "false" => Ok(Some(false)),
                _ => Err(ExecError::InvalidOption(format!(
                    "option {name} of connector {} must be true or false, not '{v}'",
                    self.connector
                ))),
            },
        }
    }

    /// An error for option `name`, which has value `value`.
    pub fn invalid(&self, name: &str, value: &str, allowed: &str) -> ExecError {
        ExecError::InvalidOption(format!(
            "option {name} of connector {} must be {allowed}, not '{value}'",
            self.connector
        ))
    }

    /// Every option was taken; otherwise an error naming one that was not
    /// and the options the connector has (`allowed`).
    pub fn finish(self, allowed: &[&str]) -> Result<()> {
        match self.left.keys().next() {
            None => Ok(()),
            Some(name) => Err(ExecError::InvalidOption(format!(
                "unknown option {name} for connector {}; it takes: {}",
                self.connector,
                allowed.join(", ")
            ))),
        }
    }
}

//! How a client proves who it is: `trust` (the playground's default, as a
//! fresh Postgres on a laptop) or SCRAM-SHA-256 (the default of a
//! JobManager), the exchange pgwire implements against the secrets of
//! [`crate::catalog::roles`].
//!
//! After a client is who it says, [`crate::wire::pg`] admits it or not: the
//! role must exist and may log in, the database must be `weir`, and the
//! role's `CONNECTION LIMIT` must have room.

use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use pgwire::api::ClientInfo;
use pgwire::api::auth::sasl::scram::ScramAuth;
use pgwire::api::auth::sasl::{SASLState, SCRAM_SHA_256_METHOD};
use pgwire::api::auth::{AuthSource, LoginInfo, Password};
use pgwire::error::{PgWireError, PgWireResult};
use pgwire::messages::startup::{Authentication, PasswordMessageFamily};

use crate::catalog::roles::Secret;
use crate::engine::api::Engine;

/// How clients authenticate (`--auth`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum AuthMethod {
    /// Anyone who can reach the port is whichever role they name.
    Trust,
    /// The role's password, proven by SCRAM-SHA-256 without sending it.
    #[value(name = "scram-sha-256")]
    ScramSha256,
}

/// The roles' SCRAM secrets, as pgwire asks for them.
#[derive(Debug)]
struct RoleSecrets(Arc<dyn Engine>);

#[async_trait]
impl AuthSource for RoleSecrets {
    async fn get_password(&self, login: &LoginInfo) -> PgWireResult<Password> {
        let secret = login
            .user()
            .and_then(|u| self.0.role(u))
            .and_then(|r| r.secret);
        // A role that does not exist or has no password still goes through
        // the exchange, against a secret nobody knows, and fails as a
        // wrong password does: the answer does not tell which roles exist.
        let secret =
            secret.unwrap_or_else(|| Secret::of(&pgwire::api::auth::sasl::scram::random_nonce()));
        Ok(Password::new(Some(secret.salt), secret.salted_password))
    }
}

/// The server's authenticator, shared by its connections.
#[derive(Debug)]
pub struct Authenticator {
    scram: Option<ScramAuth>,
}

impl Authenticator {
    pub fn new(method: AuthMethod, engine: &Arc<dyn Engine>) -> Self {
        Self {
            scram: (method == AuthMethod::ScramSha256)
                .then(|| ScramAuth::new(Arc::new(RoleSecrets(engine.clone())))),
        }
    }

    /// Whether a client must prove its password.
    pub fn requires_password(&self) -> bool {
        self.scram.is_some()
    }

    /// The request that starts the exchange.
    pub fn challenge(&self) -> Authentication {
        Authentication::SASL(vec![SCRAM_SHA_256_METHOD.to_owned()])
    }

    /// One step of a connection's exchange: the reply to send. The state
    /// is [`SASLState::Finished`] once the client has proven its password.
    pub async fn step<C: ClientInfo + Unpin + Send>(
        &self,
        client: &C,
        state: &Mutex<SASLState>,
        msg: PasswordMessageFamily,
    ) -> PgWireResult<Authentication> {
        let scram = self.scram.as_ref().ok_or(PgWireError::InvalidSASLState)?;
        // Taken out for the step; a step that fails leaves `Initial`,
        // never `Finished` (and the connection closes).
        let current = std::mem::replace(
            &mut *state.lock().unwrap_or_else(|e| e.into_inner()),
            SASLState::Initial,
        );
        let (current, msg) = match current {
            SASLState::Initial => {
                let first = msg.into_sasl_initial_response()?;
                if first.auth_method != SCRAM_SHA_256_METHOD {
                    return Err(PgWireError::UnsupportedSASLAuthMethod(first.auth_method));
                }
                (
                    SASLState::ScramClientFirstReceived,
                    PasswordMessageFamily::SASLInitialResponse(first),
                )
            }
            other => (
                other,
                PasswordMessageFamily::SASLResponse(msg.into_sasl_response()?),
            ),
        };
        let (reply, next) = scram.process_scram_message(client, msg, &current).await?;
        *state.lock().unwrap_or_else(|e| e.into_inner()) = next;
        Ok(reply)
    }
}

/// Whether an exchange has ended with the client proven.
pub fn finished(state: &Mutex<SASLState>) -> bool {
    matches!(
        *state.lock().unwrap_or_else(|e| e.into_inner()),
        SASLState::Finished
    )
}

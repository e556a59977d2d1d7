//! Roles: who may connect, how they prove it, and what they may read.
//!
//! As in Postgres, a role that may log in is a user, and `CREATE USER` is
//! `CREATE ROLE … LOGIN`. The superuser `weir` always exists. Weir's
//! privilege model is Postgres's cut down to what a read-only consumer (a
//! BI tool, a dashboard) needs: a superuser may do anything; any other role
//! may read the catalogs and the relations it was granted `SELECT` on, and
//! change nothing (`42501` otherwise). Every object belongs to the
//! superuser, so a view is read with the superuser's rights on what it
//! reads, as a Postgres view is with its owner's.
//!
//! A password is never stored: a role keeps a SCRAM-SHA-256 secret, the
//! salt and iteration count and the salted password (RFC 5802's
//! `SaltedPassword`), which is what pgwire's SCRAM exchange checks a
//! client's proof against. Postgres keeps the `StoredKey` and `ServerKey`
//! derived from it instead; the salted password is as good as the password
//! to someone who reads it, so the meta store is to be protected as a
//! password file is.
//!
//! Roles live in the meta store beside the catalog, under their names.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex, RwLock};

use pgwire::api::auth::sasl::scram::{SCRAM_ITERATIONS, gen_salted_password, random_nonce};
use serde::{Deserialize, Serialize};
use storage::meta::MetaStore;

use crate::error::{Result, ServerError};

/// The superuser every data directory has.
pub const SUPERUSER: &str = crate::SUPERUSER;
/// Its oid, Postgres's bootstrap superuser's.
pub const SUPERUSER_OID: i32 = 10;
/// Where the oids of roles made by `CREATE ROLE` start, away from the
/// relations' `16384 + id`.
const FIRST_ROLE_OID: i32 = 1_000_000;

/// One role.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Role {
    pub oid: i32,
    pub name: String,
    pub superuser: bool,
    pub login: bool,
    #[serde(default)]
    pub create_db: bool,
    #[serde(default)]
    pub create_role: bool,
    /// `CONNECTION LIMIT`; -1 for none.
    pub connection_limit: i32,
    pub secret: Option<Secret>,
    /// The relations (catalog ids) this role may `SELECT` from.
    #[serde(default)]
    pub select: BTreeSet<u64>,
}

/// A password as SCRAM-SHA-256 keeps it.
#[derive(Clone, Serialize, Deserialize)]
pub struct Secret {
    pub iterations: usize,
    pub salt: Vec<u8>,
    pub salted_password: Vec<u8>,
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(..)")
    }
}

impl Secret {
    /// The secret of `password` with a fresh salt.
    pub fn of(password: &str) -> Self {
        // pgwire's nonce is 18 random bytes, base64-encoded: as good a salt
        // as the bytes themselves.
        let salt = random_nonce().into_bytes();
        Self {
            iterations: SCRAM_ITERATIONS,
            salted_password: gen_salted_password(password, &salt, SCRAM_ITERATIONS),
            salt,
        }
    }

    /// Whether `password` is the one this secret was made from.
    pub fn matches(&self, password: &str) -> bool {
        gen_salted_password(password, &self.salt, self.iterations) == self.salted_password
    }
}

impl Role {
    /// A role with Postgres's defaults: no login, no superuser.
    pub fn new(name: &str) -> Self {
        Self {
            oid: 0,
            name: name.to_string(),
            superuser: false,
            login: false,
            create_db: false,
            create_role: false,
            connection_limit: -1,
            secret: None,
            select: BTreeSet::new(),
        }
    }
}

/// Every role, in memory and in the meta store.
#[derive(Debug)]
pub struct Roles {
    meta: Arc<MetaStore>,
    roles: RwLock<BTreeMap<String, Role>>,
    /// Connections logged in now, by role.
    logged_in: Arc<Mutex<HashMap<String, usize>>>,
}

/// One connection's place in its role's `CONNECTION LIMIT`, given back when
/// the connection ends.
#[derive(Debug)]
pub struct Login {
    logged_in: Arc<Mutex<HashMap<String, usize>>>,
    role: String,
}

impl Login {
    /// A place for a connection of `role`, if its limit has room.
    pub fn enter(roles: &Roles, role: &Role) -> Option<Login> {
        let mut counts = roles.logged_in.lock().unwrap_or_else(|e| e.into_inner());
        let n = counts.entry(role.name.clone()).or_default();
        if role.connection_limit >= 0 && *n >= role.connection_limit as usize && !role.superuser {
            return None;
        }
        *n += 1;
        Some(Login {
            logged_in: roles.logged_in.clone(),
            role: role.name.clone(),
        })
    }
}

impl Drop for Login {
    fn drop(&mut self) {
        let mut counts = self.logged_in.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(n) = counts.get_mut(&self.role) {
            *n = n.saturating_sub(1);
        }
    }
}

fn poisoned() -> ServerError {
    ServerError::Internal("roles lock poisoned".into())
}

impl Roles {
    /// Loads the roles, creating the superuser on a new data directory.
    pub fn load(meta: Arc<MetaStore>) -> Result<Self> {
        let mut roles = BTreeMap::new();
        for (name, bytes) in meta.load_roles()? {
            let role: Role = serde_json::from_slice(&bytes)
                .map_err(|e| ServerError::Internal(format!("role {name} is unreadable: {e}")))?;
            roles.insert(name, role);
        }
        let this = Self {
            meta,
            roles: RwLock::new(roles),
            logged_in: Default::default(),
        };
        if this.get(SUPERUSER).is_none() {
            let mut weir = Role::new(SUPERUSER);
            weir.oid = SUPERUSER_OID;
            weir.superuser = true;
            weir.login = true;
            weir.create_db = true;
            weir.create_role = true;
            this.write(weir)?;
        }
        Ok(this)
    }

    fn write(&self, role: Role) -> Result<()> {
        let bytes = serde_json::to_vec(&role).map_err(|e| ServerError::Internal(e.to_string()))?;
        self.meta.put_role(&role.name, Some(bytes))?;
        self.roles
            .write()
            .map_err(|_| poisoned())?
            .insert(role.name.clone(), role);
        Ok(())
    }

    pub fn get(&self, name: &str) -> Option<Role> {
        self.roles.read().ok()?.get(name).cloned()
    }

    pub fn by_oid(&self, oid: i32) -> Option<Role> {
        self.roles
            .read()
            .ok()?
            .values()
            .find(|r| r.oid == oid)
            .cloned()
    }

    /// Every role, by name.
    pub fn all(&self) -> Vec<Role> {
        self.roles
            .read()
            .map(|r| r.values().cloned().collect())
            .unwrap_or_default()
    }

    /// Adds a new role; `42710` if the name is taken.
    pub fn create(&self, mut role: Role) -> Result<()> {
        if self.get(&role.name).is_some() {
            return Err(ServerError::DuplicateName(format!(
                "role \"{}\" already exists",
                role.name
            )));
        }
        role.oid = FIRST_ROLE_OID + self.meta.allocate_ids("role", 1)? as i32;
        self.write(role)
    }

    /// Changes a role; `42704` if there is none of that name.
    pub fn update(&self, name: &str, change: impl FnOnce(&mut Role) -> Result<()>) -> Result<()> {
        let mut role = self.get(name).ok_or_else(|| missing(name))?;
        change(&mut role)?;
        self.write(role)
    }

    /// Renames a role, keeping its oid and grants.
    pub fn rename(&self, from: &str, to: &str) -> Result<()> {
        let mut role = self.get(from).ok_or_else(|| missing(from))?;
        if self.get(to).is_some() {
            return Err(ServerError::DuplicateName(format!(
                "role \"{to}\" already exists"
            )));
        }
        role.name = to.to_string();
        // A password is salted with nothing of the name, but Postgres
        // clears an MD5 one on rename; SCRAM's survives, as here.
        self.write(role)?;
        self.remove(from).map(|_| ())
    }

    /// Drops a role; false if there was none.
    pub fn remove(&self, name: &str) -> Result<bool> {
        if self.get(name).is_none() {
            return Ok(false);
        }
        self.meta.put_role(name, None)?;
        self.roles.write().map_err(|_| poisoned())?.remove(name);
        Ok(true)
    }

    /// Sets the superuser's password (from `WEIR_PASSWORD` at start-up).
    pub fn set_superuser_password(&self, password: &str) -> Result<()> {
        self.update(SUPERUSER, |r| {
            if !r.secret.as_ref().is_some_and(|s| s.matches(password)) {
                r.secret = Some(Secret::of(password));
            }
            Ok(())
        })
    }
}

/// `42704`: no role of that name.
pub fn missing(name: &str) -> ServerError {
    ServerError::UndefinedObject(format!("role \"{name}\" does not exist"))
}

//! Authentication primitives (SPEC §2): argon2id password hashing, HS256 session JWTs, the
//! login rate limiter and a constant-time comparison helper.
//!
//! This module is self-contained: it knows nothing about the database or the RPC layer.
//!
//! * Passwords are hashed with argon2id using the OWASP parameters (m = 19 MiB, t = 2,
//!   p = 1) and a random 16-byte salt, stored as a PHC string.
//! * A login returns a short-lived JWT signed with HS256. The server pins the algorithm:
//!   tokens whose header names any other algorithm (including `none`) are rejected.
//! * Login attempts are rate limited per account and per source address with in-memory
//!   token buckets whose memory is bounded.

use std::{
    collections::HashMap,
    fmt,
    hash::Hash,
    net::{IpAddr, Ipv6Addr},
    path::Path,
    sync::{Mutex, OnceLock},
    time::{Duration, Instant},
};

use anyhow::Context as _;
use argon2::{
    Argon2, Params, PasswordHash, PasswordHasher as _, PasswordVerifier as _, Version, password_hash::SaltString,
};
use base64::Engine as _;
use jsonwebtoken::{Algorithm, DecodingKey, EncodingKey, Header, Validation};
use serde::{Deserialize, Serialize};
use sha2::{Digest as _, Sha256};

// ---------------------------------------------------------------------------------------
// Passwords
// ---------------------------------------------------------------------------------------

/// argon2id memory cost in KiB (OWASP: 19 MiB).
pub const ARGON2_M_KIB: u32 = 19456;
/// argon2id iterations.
pub const ARGON2_T: u32 = 2;
/// argon2id parallelism.
pub const ARGON2_P: u32 = 1;
/// Salt length in bytes.
const SALT_LEN: usize = 16;
/// Refuse to verify against stored hashes whose cost is absurd (a corrupted or hostile row
/// must not make the server allocate gigabytes or spin for minutes).
const MAX_VERIFY_M_KIB: u32 = 1 << 20; // 1 GiB
const MAX_VERIFY_T: u32 = 64;
const MAX_VERIFY_P: u32 = 64;

fn argon2id() -> Argon2<'static> {
    let params = Params::new(ARGON2_M_KIB, ARGON2_T, ARGON2_P, None).expect("the fixed argon2 parameters are valid");
    Argon2::new(argon2::Algorithm::Argon2id, Version::V0x13, params)
}

/// Hash `plain` with argon2id (OWASP parameters, random 16-byte salt) into a PHC string
/// such as `$argon2id$v=19$m=19456,t=2,p=1$<salt>$<hash>`.
pub fn hash_password(plain: &str) -> String {
    let salt_bytes: [u8; SALT_LEN] = rand::random();
    let salt = SaltString::encode_b64(&salt_bytes).expect("a 16-byte salt is always valid");
    argon2id()
        .hash_password(plain.as_bytes(), &salt)
        .expect("argon2id with fixed parameters and a valid salt cannot fail")
        .to_string()
}

/// Check `plain` against a stored PHC string. `false` for a wrong password and for any
/// malformed, non-argon2 or absurdly expensive hash; never panics. The comparison of the
/// derived hash is constant-time.
pub fn verify_password(plain: &str, phc: &str) -> bool {
    let Ok(parsed) = PasswordHash::new(phc) else {
        return false;
    };
    if argon2::Algorithm::try_from(parsed.algorithm).is_err() {
        return false;
    }
    let Ok(params) = Params::try_from(&parsed) else {
        return false;
    };
    if params.m_cost() > MAX_VERIFY_M_KIB || params.t_cost() > MAX_VERIFY_T || params.p_cost() > MAX_VERIFY_P {
        return false;
    }
    Argon2::default().verify_password(plain.as_bytes(), &parsed).is_ok()
}

/// The `(m KiB, t, p)` parameters of an argon2id PHC string; `None` if the string is
/// malformed or not argon2id.
pub fn argon2_params_of(phc: &str) -> Option<(u32, u32, u32)> {
    let parsed = PasswordHash::new(phc).ok()?;
    if argon2::Algorithm::try_from(parsed.algorithm).ok()? != argon2::Algorithm::Argon2id {
        return None;
    }
    let params = Params::try_from(&parsed).ok()?;
    Some((params.m_cost(), params.t_cost(), params.p_cost()))
}

/// Whether a stored hash should be replaced by a fresh [`hash_password`] after a
/// successful login (different algorithm, version or parameters than today's).
pub fn needs_rehash(phc: &str) -> bool {
    let Ok(parsed) = PasswordHash::new(phc) else {
        return true;
    };
    let current_version = parsed.version == Some(Version::V0x13 as u32);
    !current_version || argon2_params_of(phc) != Some((ARGON2_M_KIB, ARGON2_T, ARGON2_P))
}

/// Spend the same time as a [`verify_password`] against a real hash. Call it when the
/// account does not exist (or has no password) so response times do not reveal that.
pub fn dummy_verify() {
    static DUMMY: OnceLock<String> = OnceLock::new();
    let phc = DUMMY.get_or_init(|| hash_password("berth-dummy-password-never-matches"));
    std::hint::black_box(verify_password("not the dummy password", phc));
}

// ---------------------------------------------------------------------------------------
// JWT
// ---------------------------------------------------------------------------------------

/// Minimum length of the HS256 signing secret, in bytes.
pub const MIN_JWT_SECRET_LEN: usize = 32;
/// Clock-skew tolerance applied to `exp` (and to `iat` being in the future), in seconds.
pub const JWT_LEEWAY_SECS: u64 = 5;
/// The only algorithm the server issues or accepts.
const JWT_ALG: Algorithm = Algorithm::HS256;

/// Claims of a Berth session token.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Claims {
    /// User id.
    pub sub: String,
    /// Tenant id.
    pub tid: String,
    /// Role in the tenant (`admin` or `member`).
    pub role: String,
    /// Issued at (Unix seconds).
    pub iat: i64,
    /// Expires at (Unix seconds).
    pub exp: i64,
    /// Unique token id (random, base64url).
    pub jti: String,
}

/// The HS256 key pair (one shared secret) used to sign and verify session JWTs.
pub struct JwtKeys {
    encoding: EncodingKey,
    decoding: DecodingKey,
    validation: Validation,
}

impl fmt::Debug for JwtKeys {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("JwtKeys")
            .field("alg", &JWT_ALG)
            .field("secret", &"<redacted>")
            .finish()
    }
}

impl JwtKeys {
    /// Read the secret from `path`; surrounding whitespace (e.g. a trailing newline) is
    /// trimmed and the rest must be at least [`MIN_JWT_SECRET_LEN`] bytes.
    pub fn from_file(path: impl AsRef<Path>) -> anyhow::Result<JwtKeys> {
        let path = path.as_ref();
        let raw = std::fs::read(path).with_context(|| format!("reading JWT secret file {}", path.display()))?;
        Self::from_secret(raw.trim_ascii()).with_context(|| format!("JWT secret file {}", path.display()))
    }

    /// Build the keys from a raw secret of at least [`MIN_JWT_SECRET_LEN`] bytes.
    pub fn from_secret(secret: &[u8]) -> anyhow::Result<JwtKeys> {
        anyhow::ensure!(
            secret.len() >= MIN_JWT_SECRET_LEN,
            "JWT secret is {} bytes; at least {MIN_JWT_SECRET_LEN} are required",
            secret.len()
        );
        let mut validation = Validation::new(JWT_ALG);
        validation.algorithms = vec![JWT_ALG];
        validation.set_required_spec_claims(&["exp", "iat", "sub"]);
        validation.leeway = JWT_LEEWAY_SECS;
        validation.validate_exp = true;
        validation.validate_nbf = false;
        validation.validate_aud = false;
        Ok(JwtKeys {
            encoding: EncodingKey::from_secret(secret),
            decoding: DecodingKey::from_secret(secret),
            validation,
        })
    }

    /// Issue a token for `user_id` in `tenant_id` with `role`, valid for `ttl`.
    pub fn issue(&self, user_id: &str, tenant_id: &str, role: &str, ttl: Duration) -> (String, Claims) {
        let iat = chrono::Utc::now().timestamp();
        let ttl = i64::try_from(ttl.as_secs()).unwrap_or(i64::MAX);
        let jti: [u8; 16] = rand::random();
        let claims = Claims {
            sub: user_id.to_owned(),
            tid: tenant_id.to_owned(),
            role: role.to_owned(),
            iat,
            exp: iat.saturating_add(ttl),
            jti: base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(jti),
        };
        (self.sign(&claims), claims)
    }

    fn sign(&self, claims: &Claims) -> String {
        jsonwebtoken::encode(&Header::new(JWT_ALG), claims, &self.encoding)
            .expect("HS256 signing of plain claims cannot fail")
    }

    /// The claims of a valid token; `None` if the token is malformed, signed with another
    /// key or algorithm (including `none`), tampered with, expired, or issued in the
    /// future.
    pub fn verify(&self, token: &str) -> Option<Claims> {
        let data = jsonwebtoken::decode::<Claims>(token, &self.decoding, &self.validation).ok()?;
        if data.header.alg != JWT_ALG {
            return None;
        }
        let claims = data.claims;
        let now = chrono::Utc::now().timestamp();
        let leeway = JWT_LEEWAY_SECS as i64;
        if claims.iat > now + leeway || claims.exp < now - leeway {
            return None;
        }
        Some(claims)
    }
}

/// Whether `s` has the shape of a JWT (three non-empty base64url segments, the header
/// starting with `eyJ`, i.e. `{"`). Used to tell session JWTs from `berth_…` credentials;
/// says nothing about validity.
pub fn looks_like_jwt(s: &str) -> bool {
    if !s.starts_with("eyJ") {
        return false;
    }
    let mut parts = 0;
    for part in s.split('.') {
        parts += 1;
        if parts > 3
            || part.is_empty()
            || !part
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        {
            return false;
        }
    }
    parts == 3
}

// ---------------------------------------------------------------------------------------
// Login rate limiter
// ---------------------------------------------------------------------------------------

/// A login attempt was refused; the client may retry after this long.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, thiserror::Error)]
#[error("too many login attempts; retry in {}s", self.secs())]
pub struct RetryAfter(pub Duration);

impl RetryAfter {
    /// Whole seconds to wait, rounded up (for a `Retry-After`-style hint); at least 1.
    pub fn secs(&self) -> u64 {
        let d = self.0;
        (d.as_secs() + u64::from(d.subsec_nanos() > 0)).max(1)
    }
}

/// Shape of one token bucket: `capacity` attempts in a burst, then one more every
/// `refill_every`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BucketConfig {
    pub capacity: u32,
    pub refill_every: Duration,
}

impl BucketConfig {
    /// Default per-account bucket: 5 attempts, then 1 per 12 s.
    pub const PER_ACCOUNT: BucketConfig = BucketConfig {
        capacity: 5,
        refill_every: Duration::from_secs(12),
    };
    /// Default per-source-address bucket: 20 attempts, then 1 per 3 s.
    pub const PER_ADDRESS: BucketConfig = BucketConfig {
        capacity: 20,
        refill_every: Duration::from_secs(3),
    };

    /// Time for an empty bucket to fill up completely.
    fn burst(&self) -> Duration {
        self.refill_every.saturating_mul(self.capacity.max(1))
    }

    /// GCRA step. A bucket is stored as its "theoretical arrival time" `tat`: the instant
    /// at which it will be full again (`tat <= now` means full; an absent bucket is full).
    /// Returns the new `tat` if one token can be taken at `now`, else how long until one
    /// can.
    fn take(&self, tat: Option<Instant>, now: Instant) -> Result<Instant, Duration> {
        let base = tat.map_or(now, |t| t.max(now));
        let new_tat = base + self.refill_every;
        let over = new_tat.duration_since(now).saturating_sub(self.burst());
        if over.is_zero() { Ok(new_tat) } else { Err(over) }
    }
}

/// Default bound on the number of tracked keys per map.
pub const LIMITER_MAX_ENTRIES: usize = 100_000;

/// In-memory login rate limiter: token buckets per account and per source address.
///
/// An attempt is allowed only if both its buckets have a token, and then takes one from
/// each. Account keys are stored as SHA-256 digests of the lowercased key (fixed size, no
/// e-mail addresses kept in memory); IPv6 addresses are grouped by /64, IPv4-mapped IPv6
/// addresses count as IPv4. Memory is bounded: full buckets are forgotten, and if a map
/// still reaches its cap the buckets closest to full are evicted.
pub struct LoginLimiter {
    per_account: BucketConfig,
    per_addr: BucketConfig,
    max_entries: usize,
    state: Mutex<LimiterState>,
}

#[derive(Default)]
struct LimiterState {
    accounts: HashMap<[u8; 32], Instant>,
    addrs: HashMap<IpAddr, Instant>,
}

impl Default for LoginLimiter {
    fn default() -> Self {
        Self::new(BucketConfig::PER_ACCOUNT, BucketConfig::PER_ADDRESS)
    }
}

impl fmt::Debug for LoginLimiter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LoginLimiter")
            .field("per_account", &self.per_account)
            .field("per_addr", &self.per_addr)
            .field("max_entries", &self.max_entries)
            .finish_non_exhaustive()
    }
}

/// The account key for the limiter: tenant plus the trimmed, lowercased e-mail.
pub fn account_key(tenant: &str, email: &str) -> String {
    format!("{}\u{0}{}", tenant.trim(), email.trim().to_lowercase())
}

impl LoginLimiter {
    pub fn new(per_account: BucketConfig, per_addr: BucketConfig) -> Self {
        LoginLimiter {
            per_account,
            per_addr,
            max_entries: LIMITER_MAX_ENTRIES,
            state: Mutex::new(LimiterState::default()),
        }
    }

    /// Change the bound on tracked keys (per map; at least 1).
    pub fn with_max_entries(mut self, max_entries: usize) -> Self {
        self.max_entries = max_entries.max(1);
        self
    }

    /// Try to spend one attempt for `account` (see [`account_key`]; it is lowercased here
    /// too) from `addr`.
    pub fn check(&self, account: &str, addr: IpAddr) -> Result<(), RetryAfter> {
        self.check_at(account, addr, Instant::now())
    }

    /// [`check`](Self::check) at an explicit time (for tests).
    pub fn check_at(&self, account: &str, addr: IpAddr, now: Instant) -> Result<(), RetryAfter> {
        let account = account_digest(account);
        let addr = addr_key(addr);
        let mut state = self.lock();
        let a = self.per_account.take(state.accounts.get(&account).copied(), now);
        let b = self.per_addr.take(state.addrs.get(&addr).copied(), now);
        match (a, b) {
            (Ok(account_tat), Ok(addr_tat)) => {
                insert_bounded(&mut state.accounts, account, account_tat, now, self.max_entries);
                insert_bounded(&mut state.addrs, addr, addr_tat, now, self.max_entries);
                Ok(())
            }
            (a, b) => {
                let wait = a.err().unwrap_or_default().max(b.err().unwrap_or_default());
                Err(RetryAfter(wait))
            }
        }
    }

    /// Forget the account's bucket (e.g. after a successful login). The address bucket is
    /// left alone.
    pub fn reset_account(&self, account: &str) {
        let account = account_digest(account);
        self.lock().accounts.remove(&account);
    }

    /// Drop every bucket that has refilled completely (they are equivalent to absent
    /// ones). Optional: the maps are also bounded without it.
    pub fn sweep(&self) {
        self.sweep_at(Instant::now());
    }

    fn sweep_at(&self, now: Instant) {
        let mut state = self.lock();
        state.accounts.retain(|_, tat| *tat > now);
        state.addrs.retain(|_, tat| *tat > now);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, LimiterState> {
        // The state is a cache of counters: a panic elsewhere cannot leave it unusable.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

pub fn account_digest(account: &str) -> [u8; 32] {
    Sha256::digest(account.to_lowercase().as_bytes()).into()
}

/// The address a limit counts under: IPv4 as is (also when IPv4-mapped), IPv6 by /64.
pub(crate) fn addr_key(addr: IpAddr) -> IpAddr {
    match addr {
        IpAddr::V4(_) => addr,
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => {
                let s = v6.segments();
                IpAddr::V6(Ipv6Addr::new(s[0], s[1], s[2], s[3], 0, 0, 0, 0))
            }
        },
    }
}

/// Insert `key`, first making room if the map is at `cap`: full buckets go first; if the
/// map is still above ~90% of `cap`, the buckets closest to full are dropped down to that,
/// so the O(n) cleanup runs at most once per `cap / 10` new keys.
fn insert_bounded<K: Eq + Hash + Copy>(map: &mut HashMap<K, Instant>, key: K, tat: Instant, now: Instant, cap: usize) {
    if map.len() >= cap && !map.contains_key(&key) {
        map.retain(|_, t| *t > now);
        let target = cap.saturating_sub((cap / 10).max(1));
        if map.len() > target {
            let excess = map.len() - target;
            let mut entries: Vec<(Instant, K)> = map.iter().map(|(k, t)| (*t, *k)).collect();
            entries.select_nth_unstable_by_key(excess - 1, |(t, _)| *t);
            for (_, k) in &entries[..excess] {
                map.remove(k);
            }
        }
    }
    map.insert(key, tat);
}

/// Token buckets per key (e.g. the request rate of each credential), bounded like
/// [`LoginLimiter`]'s maps.
pub struct KeyedLimiter {
    config: BucketConfig,
    max_entries: usize,
    state: Mutex<HashMap<[u8; 32], Instant>>,
}

impl KeyedLimiter {
    pub fn new(config: BucketConfig) -> KeyedLimiter {
        KeyedLimiter {
            config,
            max_entries: LIMITER_MAX_ENTRIES,
            state: Mutex::new(HashMap::new()),
        }
    }

    /// Take one token for `key`, or say how long until one is available.
    pub fn check(&self, key: &str) -> Result<(), RetryAfter> {
        let now = Instant::now();
        let key: [u8; 32] = Sha256::digest(key.as_bytes()).into();
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        match self.config.take(state.get(&key).copied(), now) {
            Ok(tat) => {
                insert_bounded(&mut state, key, tat, now, self.max_entries);
                Ok(())
            }
            Err(wait) => Err(RetryAfter(wait)),
        }
    }
}

// ---------------------------------------------------------------------------------------
// Constant-time comparison
// ---------------------------------------------------------------------------------------

/// Constant-time equality of two byte strings (the time depends only on the lengths). A
/// length mismatch is `false`.
pub fn ct_eq(a: &[u8], b: &[u8]) -> bool {
    use subtle::ConstantTimeEq as _;
    a.ct_eq(b).into()
}

#[cfg(test)]
mod tests {
    use std::net::Ipv4Addr;

    use super::*;

    const SECRET: &[u8] = b"0123456789abcdef0123456789abcdef-test-secret";

    fn keys() -> JwtKeys {
        JwtKeys::from_secret(SECRET).unwrap()
    }

    fn b64(data: &[u8]) -> String {
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(data)
    }

    fn claims_json(sub: &str) -> String {
        let now = chrono::Utc::now().timestamp();
        serde_json::json!({
            "sub": sub, "tid": "t1", "role": "admin",
            "iat": now, "exp": now + 600, "jti": "j",
        })
        .to_string()
    }

    // --- passwords ---

    #[test]
    fn password_roundtrip_wrong_password_and_params() {
        let phc = hash_password("correct horse battery staple");
        assert!(phc.starts_with("$argon2id$v=19$"), "{phc}");
        assert_eq!(argon2_params_of(&phc), Some((ARGON2_M_KIB, ARGON2_T, ARGON2_P)));
        assert_eq!(argon2_params_of(&phc), Some((19456, 2, 1)));
        assert!(!needs_rehash(&phc));
        assert!(verify_password("correct horse battery staple", &phc));
        assert!(!verify_password("correct horse battery staplE", &phc));
        assert!(!verify_password("", &phc));
        // Salted: the same password hashes differently.
        let salt = |p: &str| p.split('$').nth(4).map(str::to_owned);
        let other = hash_password("correct horse battery staple");
        assert_ne!(salt(&phc), salt(&other));
        // 16-byte salt = 22 unpadded base64 characters.
        assert_eq!(salt(&phc).map(|s| s.len()), Some(22));
    }

    #[test]
    fn malformed_hashes_are_rejected_without_panicking() {
        for bad in [
            "",
            "not a hash",
            "$argon2id$",
            "$argon2id$v=19$m=19456,t=2,p=1$",
            "$argon2id$v=19$m=19456,t=2,p=1$c2FsdHNhbHQ$",
            "$argon2id$v=19$m=19456,t=2,p=1$!!!$!!!",
            "$argon2id$v=19$m=0,t=0,p=0$c2FsdHNhbHRzYWx0$aGFzaGhhc2hoYXNoaGFzaA",
            "$pbkdf2-sha256$i=1000$c2FsdA$aGFzaA",
            "$2b$12$R9h/cIPz0gi.URNNX3kh2OPST9/PgBkqquzi.Ss7KIUgO2t0jWMUW",
        ] {
            assert!(!verify_password("password", bad), "{bad}");
            assert!(argon2_params_of(bad).is_none(), "{bad}");
            assert!(needs_rehash(bad), "{bad}");
        }
        // Well-formed but absurdly expensive (4 TiB): refused without attempting it.
        let huge = "$argon2id$v=19$m=4294967295,t=2,p=1$c2FsdHNhbHRzYWx0$aGFzaGhhc2hoYXNoaGFzaA";
        assert!(!verify_password("password", huge));
        assert_eq!(argon2_params_of(huge), Some((u32::MAX, 2, 1)));
        assert!(needs_rehash(huge));
    }

    #[test]
    fn cheaper_params_are_reported_and_flagged_for_rehash() {
        // Hash produced with other (cheap) argon2id parameters still verifies.
        let cheap = Argon2::new(argon2::Algorithm::Argon2id, Version::V0x13, params_cheap());
        let salt = SaltString::encode_b64(&[7u8; 16]).unwrap();
        let phc = cheap.hash_password(b"pw", &salt).unwrap().to_string();
        assert_eq!(argon2_params_of(&phc), Some((8, 1, 1)));
        assert!(needs_rehash(&phc));
        assert!(verify_password("pw", &phc));
        assert!(!verify_password("pW", &phc));
        // argon2i is not argon2id.
        let argon2i = Argon2::new(argon2::Algorithm::Argon2i, Version::V0x13, params_cheap());
        let phc_i = argon2i.hash_password(b"pw", &salt).unwrap().to_string();
        assert_eq!(argon2_params_of(&phc_i), None);
        assert!(needs_rehash(&phc_i));
    }

    fn params_cheap() -> Params {
        Params::new(8, 1, 1, None).unwrap()
    }

    #[test]
    fn dummy_verify_runs() {
        dummy_verify();
        dummy_verify();
    }

    // --- JWT ---

    #[test]
    fn jwt_roundtrip() {
        let k = keys();
        let (token, claims) = k.issue("u1", "t1", "member", Duration::from_secs(900));
        assert!(looks_like_jwt(&token), "{token}");
        assert_eq!(claims.exp - claims.iat, 900);
        assert_eq!(claims.sub, "u1");
        assert_eq!(claims.tid, "t1");
        assert_eq!(claims.role, "member");
        assert!(!claims.jti.is_empty());
        assert_eq!(k.verify(&token), Some(claims.clone()));
        let header = jsonwebtoken::decode_header(&token).unwrap();
        assert_eq!(header.alg, Algorithm::HS256);
        // Unique token ids.
        let (_, again) = k.issue("u1", "t1", "member", Duration::from_secs(900));
        assert_ne!(claims.jti, again.jti);
    }

    #[test]
    fn jwt_wrong_key_rejected() {
        let (token, _) = keys().issue("u1", "t1", "admin", Duration::from_secs(60));
        let other = JwtKeys::from_secret(b"another-secret-another-secret-another").unwrap();
        assert_eq!(other.verify(&token), None);
    }

    #[test]
    fn jwt_alg_none_rejected() {
        let k = keys();
        let body = b64(claims_json("u1").as_bytes());
        for alg in ["none", "None", "NONE", "nOnE"] {
            let header = b64(format!(r#"{{"alg":"{alg}","typ":"JWT"}}"#).as_bytes());
            assert_eq!(k.verify(&format!("{header}.{body}.")), None, "{alg}");
        }
        // alg none with the signature of a real token attached.
        let (real, _) = k.issue("u1", "t1", "admin", Duration::from_secs(60));
        let sig = real.rsplit('.').next().unwrap();
        let header = b64(br#"{"alg":"none","typ":"JWT"}"#);
        assert_eq!(k.verify(&format!("{header}.{body}.{sig}")), None);
        // And an HS256 header with an empty signature.
        let header = b64(br#"{"alg":"HS256","typ":"JWT"}"#);
        assert_eq!(k.verify(&format!("{header}.{body}.")), None);
    }

    #[test]
    fn jwt_other_algorithms_with_same_secret_rejected() {
        let k = keys();
        let now = chrono::Utc::now().timestamp();
        let claims = Claims {
            sub: "u1".into(),
            tid: "t1".into(),
            role: "admin".into(),
            iat: now,
            exp: now + 600,
            jti: "j".into(),
        };
        for alg in [Algorithm::HS384, Algorithm::HS512] {
            let token = jsonwebtoken::encode(&Header::new(alg), &claims, &EncodingKey::from_secret(SECRET)).unwrap();
            assert_eq!(k.verify(&token), None, "{alg:?}");
        }
        // Sanity: the same claims signed with HS256 pass.
        assert_eq!(k.verify(&k.sign(&claims)), Some(claims));
    }

    #[test]
    fn jwt_expired_rejected() {
        let k = keys();
        let now = chrono::Utc::now().timestamp();
        let mut claims = Claims {
            sub: "u1".into(),
            tid: "t1".into(),
            role: "admin".into(),
            iat: now - 3600,
            exp: now - 60,
            jti: "j".into(),
        };
        assert_eq!(k.verify(&k.sign(&claims)), None);
        // Just past the leeway.
        claims.exp = now - JWT_LEEWAY_SECS as i64 - 2;
        assert_eq!(k.verify(&k.sign(&claims)), None);
        // Issued in the future.
        claims.iat = now + 3600;
        claims.exp = now + 7200;
        assert_eq!(k.verify(&k.sign(&claims)), None);
    }

    #[test]
    fn jwt_missing_required_claims_rejected() {
        let k = keys();
        let now = chrono::Utc::now().timestamp();
        for claims in [
            serde_json::json!({"tid":"t","role":"r","iat":now,"exp":now+60,"jti":"j"}),
            serde_json::json!({"sub":"u","tid":"t","role":"r","exp":now+60,"jti":"j"}),
            serde_json::json!({"sub":"u","tid":"t","role":"r","iat":now,"jti":"j"}),
            serde_json::json!({"sub":"u","role":"r","iat":now,"exp":now+60,"jti":"j"}),
        ] {
            let token = jsonwebtoken::encode(&Header::new(Algorithm::HS256), &claims, &k.encoding).unwrap();
            assert_eq!(k.verify(&token), None, "{claims}");
        }
    }

    #[test]
    fn jwt_tampered_rejected() {
        let k = keys();
        let (alice, _) = k.issue("alice", "t1", "member", Duration::from_secs(600));
        let (mallory, _) = k.issue("mallory", "t1", "admin", Duration::from_secs(600));
        let a: Vec<&str> = alice.split('.').collect();
        let m: Vec<&str> = mallory.split('.').collect();
        // Mallory's (validly signed) payload with Alice's signature.
        let swapped = format!("{}.{}.{}", a[0], m[1], a[2]);
        assert_eq!(k.verify(&swapped), None);
        // A hand-edited payload.
        let forged = format!("{}.{}.{}", a[0], b64(claims_json("root").as_bytes()), a[2]);
        assert_eq!(k.verify(&forged), None);
        // A flipped signature character.
        let mut sig = a[2].to_owned();
        let last = sig.pop().unwrap();
        sig.push(if last == 'A' { 'B' } else { 'A' });
        assert_eq!(k.verify(&format!("{}.{}.{sig}", a[0], a[1])), None);
        // The untouched token still verifies.
        assert!(k.verify(&alice).is_some());
    }

    #[test]
    fn jwt_malformed_rejected() {
        let k = keys();
        for bad in [
            "",
            "abc",
            "a.b.c",
            "eyJ.eyJ.x",
            "eyJhbGciOiJIUzI1NiJ9..",
            "....",
            "berth_abcdef",
        ] {
            assert_eq!(k.verify(bad), None, "{bad}");
        }
    }

    #[test]
    fn looks_like_jwt_shapes() {
        let (token, _) = keys().issue("u", "t", "member", Duration::from_secs(60));
        assert!(looks_like_jwt(&token));
        assert!(looks_like_jwt("eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJ1In0.c2ln-_"));
        for not in [
            "",
            "berth_u_abcdef0123456789",
            "eyJhbGciOiJIUzI1NiJ9",
            "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJ1In0",
            "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJ1In0.",
            "eyJhbGciOiJIUzI1NiJ9..c2ln",
            "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJ1In0.c2ln.more",
            "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJ1In0=.c2ln",
            "eyJhbGci+/.eyJzdWIiOiJ1In0.c2ln",
            "xeyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJ1In0.c2ln",
        ] {
            assert!(!looks_like_jwt(not), "{not}");
        }
    }

    #[test]
    fn jwt_keys_from_secret_and_file() {
        assert!(JwtKeys::from_secret(b"too short").is_err());
        assert!(JwtKeys::from_secret(&[b'x'; 31]).is_err());
        assert!(JwtKeys::from_secret(&[b'x'; 32]).is_ok());

        let dir = std::env::temp_dir().join(format!(
            "berth-auth-test-{}-{}",
            std::process::id(),
            b64(&rand::random::<[u8; 8]>())
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let good = dir.join("good");
        std::fs::write(&good, [SECRET, b"\n"].concat()).unwrap();
        let from_file = JwtKeys::from_file(&good).unwrap();
        // Trimmed: the file key and the raw secret are interchangeable.
        let (token, claims) = keys().issue("u", "t", "admin", Duration::from_secs(60));
        assert_eq!(from_file.verify(&token), Some(claims));

        let short = dir.join("short");
        std::fs::write(&short, "  short-secret-padded-with-spaces      \n").unwrap();
        let err = JwtKeys::from_file(&short).unwrap_err();
        assert!(!format!("{err:#}").contains("short-secret"), "{err:#}");
        assert!(JwtKeys::from_file(dir.join("missing")).is_err());
        std::fs::remove_dir_all(&dir).unwrap();

        let dbg = format!("{from_file:?}");
        assert!(dbg.contains("redacted"), "{dbg}");
        assert!(!dbg.contains("0123456789abcdef"), "{dbg}");
        assert!(!dbg.contains("48, 49, 50"), "{dbg}");
    }

    // --- limiter ---

    fn ip(last: u8) -> IpAddr {
        IpAddr::V4(Ipv4Addr::new(192, 0, 2, last))
    }

    #[test]
    fn limiter_account_burst_then_retry_after_then_refill() {
        let l = LoginLimiter::default();
        let t0 = Instant::now();
        let acct = account_key("t1", "Alice@Example.com");
        for i in 0..5 {
            assert_eq!(l.check_at(&acct, ip(1), t0), Ok(()), "attempt {i}");
        }
        let err = l.check_at(&acct, ip(1), t0).unwrap_err();
        assert_eq!(err, RetryAfter(Duration::from_secs(12)));
        assert_eq!(err.secs(), 12);
        // Other address, different case: same account, still limited.
        let shouting = account_key("t1", "  ALICE@example.COM ");
        assert!(l.check_at(&shouting, ip(2), t0).is_err());
        // Not yet refilled.
        let err = l.check_at(&acct, ip(1), t0 + Duration::from_secs(11)).unwrap_err();
        assert_eq!(err, RetryAfter(Duration::from_secs(1)));
        // One token after 12 s, then limited again.
        let t1 = t0 + Duration::from_secs(12);
        assert_eq!(l.check_at(&acct, ip(1), t1), Ok(()));
        assert!(l.check_at(&acct, ip(1), t1).is_err());
        // Fully refilled after 5 × 12 s.
        let t2 = t1 + Duration::from_secs(60);
        for _ in 0..5 {
            assert_eq!(l.check_at(&acct, ip(1), t2), Ok(()));
        }
        assert!(l.check_at(&acct, ip(1), t2).is_err());
    }

    #[test]
    fn limiter_accounts_are_independent_and_tenant_scoped() {
        let l = LoginLimiter::default();
        let t0 = Instant::now();
        let alice = account_key("t1", "alice@example.com");
        for i in 0..5 {
            assert_eq!(l.check_at(&alice, IpAddr::from([10, 0, 0, i]), t0), Ok(()));
        }
        assert!(l.check_at(&alice, ip(9), t0).is_err());
        // Bob (same tenant, same address as an attempt on alice) is unaffected.
        let bob = account_key("t1", "bob@example.com");
        assert_eq!(l.check_at(&bob, IpAddr::from([10, 0, 0, 0]), t0), Ok(()));
        // Alice in another tenant is another account.
        let alice2 = account_key("t2", "alice@example.com");
        assert_eq!(l.check_at(&alice2, ip(9), t0), Ok(()));
        // Reset after a successful login.
        l.reset_account(&alice);
        assert_eq!(l.check_at(&alice, ip(9), t0), Ok(()));
    }

    #[test]
    fn limiter_per_address_across_many_accounts() {
        let l = LoginLimiter::default();
        let t0 = Instant::now();
        let attacker = ip(66);
        for i in 0..20 {
            let acct = account_key("t1", &format!("user{i}@example.com"));
            assert_eq!(l.check_at(&acct, attacker, t0), Ok(()), "attempt {i}");
        }
        let fresh = account_key("t1", "fresh@example.com");
        let err = l.check_at(&fresh, attacker, t0).unwrap_err();
        assert_eq!(err, RetryAfter(Duration::from_secs(3)));
        // The refused attempt did not consume the account's token: fresh still has 5.
        let other_addr = ip(67);
        for _ in 0..5 {
            assert_eq!(l.check_at(&fresh, other_addr, t0), Ok(()));
        }
        assert!(l.check_at(&fresh, other_addr, t0).is_err());
        // Another address is not limited by the attacker's.
        let acct = account_key("t1", "someone@example.com");
        assert_eq!(l.check_at(&acct, ip(68), t0), Ok(()));
        // The attacker's address refills at one per 3 s.
        let t1 = t0 + Duration::from_secs(3);
        let a = account_key("t1", "a@example.com");
        let b = account_key("t1", "b@example.com");
        assert_eq!(l.check_at(&a, attacker, t1), Ok(()));
        assert!(l.check_at(&b, attacker, t1).is_err());
    }

    #[test]
    fn limiter_both_limited_reports_longest_wait() {
        let l = LoginLimiter::default();
        let t0 = Instant::now();
        let acct = account_key("t1", "x@example.com");
        for i in 0..5 {
            assert!(l.check_at(&acct, ip(1), t0).is_ok(), "{i}");
        }
        for i in 0..15 {
            let other = account_key("t1", &format!("o{i}@example.com"));
            assert!(l.check_at(&other, ip(1), t0).is_ok(), "{i}");
        }
        let err = l.check_at(&acct, ip(1), t0).unwrap_err();
        assert_eq!(err.0, Duration::from_secs(12));
    }

    #[test]
    fn limiter_ipv6_grouped_by_64() {
        let l = LoginLimiter::default();
        let t0 = Instant::now();
        for i in 0..20u16 {
            let addr = IpAddr::V6(Ipv6Addr::new(0x2001, 0xdb8, 1, 2, i, i, i, i));
            let acct = account_key("t1", &format!("u{i}@example.com"));
            assert_eq!(l.check_at(&acct, addr, t0), Ok(()));
        }
        let same_64 = IpAddr::V6(Ipv6Addr::new(0x2001, 0xdb8, 1, 2, 0xffff, 1, 2, 3));
        assert!(l.check_at("t1\0new@example.com", same_64, t0).is_err());
        let other_64 = IpAddr::V6(Ipv6Addr::new(0x2001, 0xdb8, 1, 3, 0, 0, 0, 1));
        assert!(l.check_at("t1\0new@example.com", other_64, t0).is_ok());
        // IPv4-mapped counts as the IPv4 address.
        let v4 = Ipv4Addr::new(198, 51, 100, 7);
        assert_eq!(addr_key(IpAddr::V6(v4.to_ipv6_mapped())), IpAddr::V4(v4));
    }

    #[test]
    fn limiter_memory_is_bounded() {
        let cap = 1000;
        let l = LoginLimiter::default().with_max_entries(cap);
        let t0 = Instant::now();
        for i in 0..10 * cap as u32 {
            let acct = format!("t1\0user{i}@example.com");
            let addr = IpAddr::V4(Ipv4Addr::from(0x0a00_0000 + i));
            assert!(l.check_at(&acct, addr, t0).is_ok());
            let state = l.lock();
            assert!(state.accounts.len() <= cap, "{}", state.accounts.len());
            assert!(state.addrs.len() <= cap, "{}", state.addrs.len());
        }
        // The most recent keys are still tracked.
        assert!(
            l.lock()
                .accounts
                .contains_key(&account_digest(&format!("t1\0user{}@example.com", 10 * cap - 1)))
        );
        // Once every bucket has refilled, a sweep forgets all of them.
        l.sweep_at(t0 + Duration::from_secs(3600));
        let state = l.lock();
        assert!(state.accounts.is_empty() && state.addrs.is_empty());
    }

    #[test]
    fn limiter_full_buckets_are_evicted_before_live_ones() {
        let l = LoginLimiter::default().with_max_entries(10);
        let t0 = Instant::now();
        // A limited account (full again only at t0 + 60 s)...
        let victim = "t1\0victim@example.com";
        for _ in 0..5 {
            assert!(l.check_at(victim, ip(1), t0).is_ok());
        }
        // ...9 one-off attempts (full again at t0 + 12 s)...
        for i in 0..9u8 {
            let acct = format!("t1\0other{i}@example.com");
            assert!(l.check_at(&acct, ip(10 + i), t0).is_ok());
        }
        // ...and, at t0 + 20 s, new accounts that overflow the map: the refilled one-offs
        // are evicted, the victim is not (it has refilled only one token by now).
        let t1 = t0 + Duration::from_secs(20);
        for i in 0..5u8 {
            let acct = format!("t1\0late{i}@example.com");
            assert!(l.check_at(&acct, ip(100 + i), t1).is_ok());
        }
        assert!(l.lock().accounts.len() <= 10);
        assert!(l.check_at(victim, ip(1), t1).is_ok());
        assert!(l.check_at(victim, ip(1), t1).is_err());
    }

    // --- ct_eq ---

    #[test]
    fn ct_eq_works() {
        assert!(ct_eq(b"", b""));
        assert!(ct_eq(b"berth_abc", b"berth_abc"));
        assert!(!ct_eq(b"berth_abc", b"berth_abd"));
        assert!(!ct_eq(b"berth_abc", b"berth_ab"));
        assert!(!ct_eq(b"", b"x"));
    }
}

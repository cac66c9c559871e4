//! Service-account tokens (issue #40): bound tokens as the apiserver issues them, JWTs signed
//! ES256, with upstream's claims (`iss`, `sub`, `aud`, `exp`, `nbf`, `iat`, `jti`, and
//! `kubernetes.io` naming the namespace, the ServiceAccount, and the pod and node a token is
//! bound to).
//!
//! Every agent signs with a key of its own: a P-256 key made at its first start and kept in its
//! data dir (`service-account.key`, mode 0600). Only the public half leaves the node: the agent
//! publishes it as a ConfigMap in `kube-system` ([`key_object`]), so every agent can verify
//! every agent's tokens and the OIDC discovery document lists them all. Nothing secret is
//! replicated, and two agents never race to make one shared key.
//!
//! JWT encoding, decoding and the checks of `aud` and `iss` are jsonwebtoken's; its signatures
//! go through ring (already in the tree through rustls) by a [`CryptoProvider`] of ours, so the
//! build gains no second crypto library. What makes a token valid beyond its signature (its
//! times, its binding to objects that still exist) is [`check`], pure, time as an input.

use std::collections::HashSet;
use std::path::Path;
use std::sync::{Arc, Mutex, PoisonError};

use base64::Engine;
use jsonwebtoken::crypto::{CryptoProvider, JwtSigner, JwtVerifier, KeyUtils};
use jsonwebtoken::jwk::{EllipticCurve, ThumbprintHash};
use jsonwebtoken::{Algorithm, DecodingKey, EncodingKey, Header, Validation};
use ring::rand::SystemRandom;
use ring::signature::{
    ECDSA_P256_SHA256_FIXED, ECDSA_P256_SHA256_FIXED_SIGNING, EcdsaKeyPair, KeyPair,
    UnparsedPublicKey,
};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use shoal_model::rbac::{AUTHENTICATED, User};

/// The label of the ConfigMaps that publish the agents' token-verifying keys.
pub const KEY_LABEL: &str = "shoal.io/service-account-key";
/// The namespace holding them.
pub const KEY_NAMESPACE: &str = "kube-system";
/// The longest a bearer token may be before it is parsed (upstream's tokens are ~1 KiB).
pub const MAX_TOKEN_BYTES: usize = 8 * 1024;
/// A TokenRequest's default lifetime (`kubectl create token` asks for none: an hour).
pub const DEFAULT_SECONDS: u64 = 3600;
/// The shortest lifetime a TokenRequest may ask for (upstream's).
pub const MIN_SECONDS: u64 = 600;
/// The longest (upstream's validation: 2^32 seconds).
pub const MAX_SECONDS: u64 = 1 << 32;
/// The group every ServiceAccount is in.
pub const SERVICE_ACCOUNTS: &str = "system:serviceaccounts";

/// The issuer of a cluster whose DNS domain is `domain` (upstream's default
/// `--service-account-issuer`), which is also the tokens' default audience.
pub fn issuer_url(domain: &str) -> String {
    format!("https://kubernetes.default.svc.{domain}")
}

/// The `kubernetes.io` claim: what the token is bound to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Bound {
    pub namespace: String,
    pub serviceaccount: Ref,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod: Option<Ref>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<Ref>,
}

/// An object a token names, by name and uid.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Ref {
    pub name: String,
    pub uid: String,
}

/// A bound token's claims.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Claims {
    pub aud: Vec<String>,
    pub exp: u64,
    pub iat: u64,
    pub iss: String,
    pub jti: String,
    pub nbf: u64,
    pub sub: String,
    #[serde(rename = "kubernetes.io")]
    pub kubernetes: Bound,
}

impl Claims {
    /// The identity these claims authenticate: the ServiceAccount's user name and groups, as
    /// upstream's authenticator gives them.
    pub fn user(&self) -> User {
        let ns = &self.kubernetes.namespace;
        User {
            name: format!(
                "system:serviceaccount:{ns}:{}",
                self.kubernetes.serviceaccount.name
            ),
            groups: vec![
                SERVICE_ACCOUNTS.to_owned(),
                format!("{SERVICE_ACCOUNTS}:{ns}"),
                AUTHENTICATED.to_owned(),
            ],
        }
    }
}

/// What a token is asked for (a TokenRequest, or the kubelet for a pod's volume).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    pub namespace: String,
    pub account: Ref,
    pub audiences: Vec<String>,
    pub seconds: u64,
    pub pod: Option<Ref>,
    pub node: Option<Ref>,
}

/// The claims of a token issued at `now` (seconds since the epoch) for `request` by `issuer`.
pub fn claims(issuer: &str, request: &Request, now: u64, jti: String) -> Claims {
    let audiences = if request.audiences.is_empty() {
        vec![issuer.to_owned()]
    } else {
        request.audiences.clone()
    };
    Claims {
        aud: audiences,
        exp: now.saturating_add(request.seconds),
        iat: now,
        iss: issuer.to_owned(),
        jti,
        nbf: now,
        sub: format!(
            "system:serviceaccount:{}:{}",
            request.namespace, request.account.name
        ),
        kubernetes: Bound {
            namespace: request.namespace.clone(),
            serviceaccount: request.account.clone(),
            pod: request.pod.clone(),
            node: request.node.clone(),
        },
    }
}

/// Why a token is refused (logged at debug level on the server; the client only ever reads
/// `Unauthorized`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error("not a token this cluster issued: {0}")]
    Malformed(String),
    #[error("signed by no key this cluster publishes")]
    UnknownKey,
    #[error("the signature or a claim does not verify: {0}")]
    Invalid(String),
    #[error("expired")]
    Expired,
    #[error("not valid yet")]
    NotYetValid,
    #[error("the token's {0} no longer exists")]
    Gone(&'static str),
}

/// The objects a token's binding is checked against, as they are now: the ServiceAccount's
/// uid, the pod's uid (a token whose pod is gone, or was replaced by another of the same
/// name, is refused; the node it names is informational: a pod that moves is a new pod).
pub struct Bindings<'a> {
    pub account_uid: Option<&'a str>,
    pub pod_uid: Option<&'a str>,
}

/// Whether verified `claims` are valid at `now`: within their times, and still bound to the
/// ServiceAccount (same uid) and pod (same uid) they name, as upstream's authenticator
/// checks. A deleted-and-recreated ServiceAccount or pod of the same name does not revive an
/// old token.
pub fn check(claims: &Claims, now: u64, bindings: &Bindings<'_>) -> Result<(), Refusal> {
    if now >= claims.exp {
        return Err(Refusal::Expired);
    }
    if now < claims.nbf {
        return Err(Refusal::NotYetValid);
    }
    if bindings.account_uid != Some(claims.kubernetes.serviceaccount.uid.as_str()) {
        return Err(Refusal::Gone("ServiceAccount"));
    }
    if let Some(pod) = &claims.kubernetes.pod
        && bindings.pod_uid != Some(pod.uid.as_str())
    {
        return Err(Refusal::Gone("pod"));
    }
    Ok(())
}

/// The key id of a P-256 public key (uncompressed SEC1 point): the base64url SHA-256 of its
/// bytes.
fn key_id(public: &[u8]) -> String {
    let digest = ring::digest::digest(&ring::digest::SHA256, public);
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(digest.as_ref())
}

/// The JWK of a P-256 public key (uncompressed SEC1 point), or `None` for other bytes.
pub fn jwk(public: &[u8]) -> Option<Value> {
    if public.len() != 65 || public[0] != 4 {
        return None;
    }
    let b64 = |b: &[u8]| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(b);
    Some(json!({
        "use": "sig",
        "kty": "EC",
        "kid": key_id(public),
        "crv": "P-256",
        "alg": "ES256",
        "x": b64(&public[1..33]),
        "y": b64(&public[33..]),
    }))
}

/// This agent's token signer.
pub struct Signer {
    key: EncodingKey,
    public: Vec<u8>,
    kid: String,
    issuer: String,
}

#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    #[error("service-account key {path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
    #[error("service-account key {0} is not a P-256 PKCS#8 key")]
    Invalid(String),
    #[error("a service-account key could not be made")]
    Generate,
    #[error("a token could not be signed: {0}")]
    Sign(String),
}

impl Signer {
    /// The signer whose key is kept at `dir/service-account.key` (made there, mode 0600, when
    /// absent), issuing as `issuer`.
    pub fn load_or_create(dir: &Path, issuer: String) -> Result<Self, KeyError> {
        install_provider();
        let path = dir.join("service-account.key");
        let io = |source| KeyError::Io {
            path: path.display().to_string(),
            source,
        };
        let pkcs8 = match std::fs::read(&path) {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                let made = EcdsaKeyPair::generate_pkcs8(
                    &ECDSA_P256_SHA256_FIXED_SIGNING,
                    &SystemRandom::new(),
                )
                .map_err(|_| KeyError::Generate)?;
                use std::io::Write;
                use std::os::unix::fs::OpenOptionsExt;
                let tmp = path.with_extension("key.tmp");
                let mut file = std::fs::OpenOptions::new()
                    .write(true)
                    .create(true)
                    .truncate(true)
                    .mode(0o600)
                    .open(&tmp)
                    .map_err(io)?;
                file.write_all(made.as_ref()).map_err(io)?;
                file.sync_all().map_err(io)?;
                std::fs::rename(&tmp, &path).map_err(io)?;
                made.as_ref().to_vec()
            }
            Err(e) => return Err(io(e)),
        };
        Self::from_pkcs8(&pkcs8, issuer)
            .ok_or_else(|| KeyError::Invalid(path.display().to_string()))
    }

    fn from_pkcs8(pkcs8: &[u8], issuer: String) -> Option<Self> {
        install_provider();
        let pair = EcdsaKeyPair::from_pkcs8(
            &ECDSA_P256_SHA256_FIXED_SIGNING,
            pkcs8,
            &SystemRandom::new(),
        )
        .ok()?;
        let public = pair.public_key().as_ref().to_vec();
        Some(Self {
            key: EncodingKey::from_ec_der(pkcs8),
            kid: key_id(&public),
            public,
            issuer,
        })
    }

    pub fn issuer(&self) -> &str {
        &self.issuer
    }

    /// A token for `request`, issued at `now`.
    pub fn issue(&self, request: &Request, now: u64) -> Result<(String, Claims), KeyError> {
        let mut jti = [0u8; 16];
        rand::fill(&mut jti);
        let claims = claims(
            &self.issuer,
            request,
            now,
            shoal_state::object::uuid_string(&jti),
        );
        let mut header = Header::new(Algorithm::ES256);
        header.kid = Some(self.kid.clone());
        let token = jsonwebtoken::encode(&header, &claims, &self.key)
            .map_err(|e| KeyError::Sign(e.to_string()))?;
        Ok((token, claims))
    }

    /// The ConfigMap that publishes this agent's public key (node `node`), for the store.
    pub fn key_object(&self, node: &str) -> Value {
        json!({
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {
                "name": format!("service-account-key-{node}"),
                "namespace": KEY_NAMESPACE,
                "labels": {KEY_LABEL: "true"},
            },
            "data": {"jwk": jwk(&self.public).map(|j| j.to_string()).unwrap_or_default()},
        })
    }
}

/// Verifies tokens with the keys the agents publish, keeping the keys it parsed and the
/// tokens it verified (by their SHA-256): a client sends the same token with every request,
/// and a signature check costs far more than the rest of an authorization. What a verified
/// token's validity depends on beyond its bytes (its times, its bindings) is checked at every
/// use ([`check`]).
#[derive(Default)]
pub struct Verifier {
    keys: Mutex<Vec<(String, Arc<DecodingKey>)>>,
    verified: Mutex<std::collections::HashMap<[u8; 32], Verified>>,
}

/// A token whose signature verified: for which audiences, and its claims.
type Verified = (Vec<String>, Claims);

/// Verified tokens kept at most; past it the cache starts over.
const MAX_VERIFIED: usize = 4_096;

impl Verifier {
    /// The claims of `token` if one of the published keys (`published`: the JWKs in the
    /// store, read only when the token's key is not known yet) signed it for `issuer` and one
    /// of `audiences`. Its times and bindings are [`check`]'s.
    pub fn verify(
        &self,
        token: &str,
        issuer: &str,
        audiences: &[String],
        published: impl FnOnce() -> Vec<Value>,
    ) -> Result<Claims, Refusal> {
        install_provider();
        if token.len() > MAX_TOKEN_BYTES {
            return Err(Refusal::Malformed("too long".into()));
        }
        let digest: [u8; 32] = ring::digest::digest(&ring::digest::SHA256, token.as_bytes())
            .as_ref()
            .try_into()
            .unwrap_or([0; 32]);
        if let Some((for_audiences, claims)) = self
            .verified
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&digest)
            && for_audiences == audiences
            && claims.iss == issuer
        {
            return Ok(claims.clone());
        }
        let claims = self.verify_signature(token, issuer, audiences, published)?;
        let mut verified = self.verified.lock().unwrap_or_else(PoisonError::into_inner);
        if verified.len() >= MAX_VERIFIED {
            verified.clear();
        }
        verified.insert(digest, (audiences.to_vec(), claims.clone()));
        Ok(claims)
    }

    fn verify_signature(
        &self,
        token: &str,
        issuer: &str,
        audiences: &[String],
        published: impl FnOnce() -> Vec<Value>,
    ) -> Result<Claims, Refusal> {
        let header =
            jsonwebtoken::decode_header(token).map_err(|e| Refusal::Malformed(e.to_string()))?;
        if header.alg != Algorithm::ES256 {
            return Err(Refusal::Malformed(format!("algorithm {:?}", header.alg)));
        }
        let kid = header.kid.ok_or(Refusal::UnknownKey)?;
        let key = self.key(&kid, published).ok_or(Refusal::UnknownKey)?;
        let mut validation = Validation::new(Algorithm::ES256);
        // Times are `check`'s (time as an input); the signature, `iss` and `aud` are here.
        validation.validate_exp = false;
        validation.validate_nbf = false;
        validation.required_spec_claims = HashSet::new();
        validation.set_issuer(&[issuer]);
        validation.set_audience(audiences);
        jsonwebtoken::decode::<Claims>(token, &key, &validation)
            .map(|data| data.claims)
            .map_err(|e| Refusal::Invalid(e.to_string()))
    }

    fn key(&self, kid: &str, published: impl FnOnce() -> Vec<Value>) -> Option<Arc<DecodingKey>> {
        let known = |keys: &Vec<(String, Arc<DecodingKey>)>| {
            keys.iter().find(|(k, _)| k == kid).map(|(_, d)| d.clone())
        };
        if let Some(key) = known(&self.keys.lock().unwrap_or_else(PoisonError::into_inner)) {
            return Some(key);
        }
        let parsed: Vec<(String, Arc<DecodingKey>)> = published()
            .iter()
            .filter_map(|jwk| {
                let (kid, x, y) = (jwk["kid"].as_str()?, jwk["x"].as_str()?, jwk["y"].as_str()?);
                let key = DecodingKey::from_ec_components(x, y).ok()?;
                Some((kid.to_owned(), Arc::new(key)))
            })
            .collect();
        let mut keys = self.keys.lock().unwrap_or_else(PoisonError::into_inner);
        *keys = parsed;
        known(&keys)
    }
}

/// Whether a token issued at `iat` expiring at `exp` is replaced at `now`, as the kubelet's
/// token manager decides: past 80 % of its life, or older than a day.
pub fn needs_refresh(iat: u64, exp: u64, now: u64) -> bool {
    let life = exp.saturating_sub(iat);
    now >= iat.saturating_add(life / 5 * 4) || now >= iat.saturating_add(86_400)
}

/// This agent's token issuer and verifier.
pub struct Tokens {
    pub signer: Signer,
    pub verifier: Verifier,
    /// The audiences the API accepts (the issuer's URL, upstream's default `--api-audiences`).
    pub audiences: Vec<String>,
}

impl std::fmt::Debug for Tokens {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokens")
            .field("issuer", &self.signer.issuer)
            .field("kid", &self.signer.kid)
            .finish_non_exhaustive()
    }
}

impl Tokens {
    pub fn new(signer: Signer) -> Self {
        Self {
            audiences: vec![signer.issuer.clone()],
            signer,
            verifier: Verifier::default(),
        }
    }

    /// The ServiceAccount a bearer token authenticates, checked against the store as it is
    /// now (`now`: seconds since the epoch).
    pub fn authenticate(
        &self,
        replication: &crate::replication::Replication,
        token: &str,
        now: u64,
    ) -> Result<Claims, Refusal> {
        self.authenticate_for(replication, token, &self.audiences, now)
    }

    /// [`Self::authenticate`] for one of `audiences` (a TokenReview's).
    pub fn authenticate_for(
        &self,
        replication: &crate::replication::Replication,
        token: &str,
        audiences: &[String],
        now: u64,
    ) -> Result<Claims, Refusal> {
        let claims = self
            .verifier
            .verify(token, &self.signer.issuer, audiences, || {
                replication.read(|s| published_keys(&s.list("", "ConfigMap", Some(KEY_NAMESPACE))))
            })?;
        let bound = &claims.kubernetes;
        let (account, pod) = replication.read(|s| {
            let get = |kind: &str, name: &str| {
                let info = shoal_state::kind::lookup("v1", kind)?;
                s.get(&shoal_state::ObjectKey::new(info, &bound.namespace, name))
            };
            let uid =
                |o: Option<Value>| o.and_then(|o| o["metadata"]["uid"].as_str().map(str::to_owned));
            (
                uid(get("ServiceAccount", &bound.serviceaccount.name)),
                bound.pod.as_ref().and_then(|p| uid(get("Pod", &p.name))),
            )
        });
        check(
            &claims,
            now,
            &Bindings {
                account_uid: account.as_deref(),
                pod_uid: pod.as_deref(),
            },
        )?;
        Ok(claims)
    }
}

/// The JWKs published in `config_maps` (the agents' key ConfigMaps).
pub fn published_keys(config_maps: &[Value]) -> Vec<Value> {
    config_maps
        .iter()
        .filter(|c| c["metadata"]["labels"][KEY_LABEL] == "true")
        .filter_map(|c| serde_json::from_str(c["data"]["jwk"].as_str()?).ok())
        .filter(|j: &Value| j["kty"] == "EC" && j["crv"] == "P-256")
        .collect()
}

// ---- jsonwebtoken's signatures through ring ----

struct RingSigner(EcdsaKeyPair);

impl signature::Signer<Vec<u8>> for RingSigner {
    fn try_sign(&self, msg: &[u8]) -> Result<Vec<u8>, signature::Error> {
        self.0
            .sign(&SystemRandom::new(), msg)
            .map(|s| s.as_ref().to_vec())
            .map_err(|_| signature::Error::new())
    }
}

impl JwtSigner for RingSigner {
    fn algorithm(&self) -> Algorithm {
        Algorithm::ES256
    }
}

struct RingVerifier(Vec<u8>);

impl signature::Verifier<Vec<u8>> for RingVerifier {
    fn verify(&self, msg: &[u8], signature: &Vec<u8>) -> Result<(), signature::Error> {
        UnparsedPublicKey::new(&ECDSA_P256_SHA256_FIXED, &self.0)
            .verify(msg, signature)
            .map_err(|_| signature::Error::new())
    }
}

impl JwtVerifier for RingVerifier {
    fn algorithm(&self) -> Algorithm {
        Algorithm::ES256
    }
}

fn unsupported() -> jsonwebtoken::errors::Error {
    jsonwebtoken::errors::ErrorKind::InvalidAlgorithm.into()
}

static PROVIDER: CryptoProvider = CryptoProvider {
    signer_factory: |alg, key| {
        if *alg != Algorithm::ES256 {
            return Err(unsupported());
        }
        let pair = EcdsaKeyPair::from_pkcs8(
            &ECDSA_P256_SHA256_FIXED_SIGNING,
            key.as_bytes(),
            &SystemRandom::new(),
        )
        .map_err(|_| {
            jsonwebtoken::errors::Error::from(jsonwebtoken::errors::ErrorKind::InvalidEcdsaKey)
        })?;
        Ok(Box::new(RingSigner(pair)))
    },
    verifier_factory: |alg, key| {
        if *alg != Algorithm::ES256 {
            return Err(unsupported());
        }
        Ok(Box::new(RingVerifier(key.try_get_as_bytes()?.to_vec())))
    },
    key_utils: KeyUtils {
        rsa_pub_components_from_private_key: |_| Err(unsupported()),
        rsa_pub_components_from_public_key: |_| Err(unsupported()),
        ec_pub_components_from_private_key: |der, _| {
            let pair = EcdsaKeyPair::from_pkcs8(
                &ECDSA_P256_SHA256_FIXED_SIGNING,
                der,
                &SystemRandom::new(),
            )
            .map_err(|_| unsupported())?;
            let public = pair.public_key().as_ref();
            Ok((
                EllipticCurve::P256,
                public[1..33].to_vec(),
                public[33..].to_vec(),
            ))
        },
        ed_pub_components_from_private_key: |_, _| Err(unsupported()),
        compute_digest: |data, hash| {
            let algorithm = match hash {
                ThumbprintHash::SHA256 => &ring::digest::SHA256,
                ThumbprintHash::SHA384 => &ring::digest::SHA384,
                ThumbprintHash::SHA512 => &ring::digest::SHA512,
                _ => return Err(unsupported()),
            };
            Ok(ring::digest::digest(algorithm, data).as_ref().to_vec())
        },
    },
};

/// Makes ring jsonwebtoken's provider (once per process; a provider installed before is
/// kept).
fn install_provider() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let _ = PROVIDER.install_default();
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    const ISSUER: &str = "https://kubernetes.default.svc.cluster.local";

    fn signer() -> Signer {
        let pkcs8 =
            EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, &SystemRandom::new())
                .unwrap();
        Signer::from_pkcs8(pkcs8.as_ref(), ISSUER.into()).unwrap()
    }

    fn request() -> Request {
        Request {
            namespace: "dev".into(),
            account: Ref {
                name: "bot".into(),
                uid: "sa-1".into(),
            },
            audiences: vec![],
            seconds: 3600,
            pod: Some(Ref {
                name: "web".into(),
                uid: "pod-1".into(),
            }),
            node: None,
        }
    }

    fn published(s: &Signer) -> Vec<Value> {
        published_keys(&[s.key_object("n0")])
    }

    #[test]
    fn a_token_verifies_with_the_published_key_and_names_its_account() {
        let s = signer();
        let (token, claims) = s.issue(&request(), 1_000).unwrap();
        assert_eq!(claims.aud, vec![ISSUER.to_owned()]);
        assert_eq!(claims.exp, 4_600);
        let v = Verifier::default();
        let got = v
            .verify(&token, ISSUER, &[ISSUER.to_owned()], || published(&s))
            .unwrap();
        assert_eq!(got, claims);
        let user = got.user();
        assert_eq!(user.name, "system:serviceaccount:dev:bot");
        assert_eq!(
            user.groups,
            [
                "system:serviceaccounts",
                "system:serviceaccounts:dev",
                "system:authenticated"
            ]
        );
        // The upstream claim layout clients and verifiers read.
        let payload = token.split('.').nth(1).unwrap();
        let raw: Value = serde_json::from_slice(
            &base64::engine::general_purpose::URL_SAFE_NO_PAD
                .decode(payload)
                .unwrap(),
        )
        .unwrap();
        assert_eq!(raw["kubernetes.io"]["pod"]["uid"], "pod-1");
        assert_eq!(raw["sub"], "system:serviceaccount:dev:bot");
    }

    #[test]
    fn tokens_from_other_keys_audiences_issuers_or_forged_bytes_are_refused() {
        let s = signer();
        let other = signer();
        let v = Verifier::default();
        let audiences = [ISSUER.to_owned()];
        let (token, _) = other.issue(&request(), 1_000).unwrap();
        // Signed by a key the cluster does not publish.
        assert_eq!(
            v.verify(&token, ISSUER, &audiences, || published(&s)),
            Err(Refusal::UnknownKey)
        );
        // A key id the cluster publishes, another key's signature.
        let (good, _) = s.issue(&request(), 1_000).unwrap();
        let forged = format!(
            "{}.{}",
            good.rsplit_once('.').unwrap().0,
            token.rsplit_once('.').unwrap().1
        );
        assert!(matches!(
            v.verify(&forged, ISSUER, &audiences, || published(&s)),
            Err(Refusal::Invalid(_))
        ));
        // A changed payload under the right signature.
        let parts: Vec<&str> = good.split('.').collect();
        let mut claims: Value = serde_json::from_slice(
            &base64::engine::general_purpose::URL_SAFE_NO_PAD
                .decode(parts[1])
                .unwrap(),
        )
        .unwrap();
        claims["sub"] = json!("system:serviceaccount:kube-system:admin");
        let tampered = format!(
            "{}.{}.{}",
            parts[0],
            base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(claims.to_string()),
            parts[2]
        );
        assert!(matches!(
            v.verify(&tampered, ISSUER, &audiences, || published(&s)),
            Err(Refusal::Invalid(_))
        ));
        // Another audience, another issuer.
        let mut vault = request();
        vault.audiences = vec!["vault".into()];
        let (for_vault, _) = s.issue(&vault, 1_000).unwrap();
        assert!(matches!(
            v.verify(&for_vault, ISSUER, &audiences, || published(&s)),
            Err(Refusal::Invalid(_))
        ));
        assert!(matches!(
            v.verify(&good, "https://elsewhere", &audiences, || published(&s)),
            Err(Refusal::Invalid(_))
        ));
        // Not a JWT at all; too long; `alg: none`.
        assert!(matches!(
            v.verify("abc", ISSUER, &audiences, Vec::new),
            Err(Refusal::Malformed(_))
        ));
        let long = "a".repeat(MAX_TOKEN_BYTES + 1);
        assert!(matches!(
            v.verify(&long, ISSUER, &audiences, Vec::new),
            Err(Refusal::Malformed(_))
        ));
        let none = format!(
            "{}.{}.",
            base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(r#"{"alg":"none","kid":"x"}"#),
            parts[1]
        );
        assert!(
            v.verify(&none, ISSUER, &audiences, || published(&s))
                .is_err()
        );
    }

    #[test]
    fn a_token_is_valid_within_its_times_and_while_what_it_is_bound_to_exists() {
        let s = signer();
        let (_, claims) = s.issue(&request(), 1_000).unwrap();
        let live = Bindings {
            account_uid: Some("sa-1"),
            pod_uid: Some("pod-1"),
        };
        assert_eq!(check(&claims, 1_000, &live), Ok(()));
        assert_eq!(check(&claims, 4_599, &live), Ok(()));
        assert_eq!(check(&claims, 4_600, &live), Err(Refusal::Expired));
        assert_eq!(check(&claims, 999, &live), Err(Refusal::NotYetValid));
        let cases = [
            (None, Some("pod-1"), "ServiceAccount"),
            (Some("sa-2"), Some("pod-1"), "ServiceAccount"),
            (Some("sa-1"), None, "pod"),
            (Some("sa-1"), Some("pod-2"), "pod"),
        ];
        for (account_uid, pod_uid, gone) in cases {
            let b = Bindings {
                account_uid,
                pod_uid,
            };
            assert_eq!(check(&claims, 2_000, &b), Err(Refusal::Gone(gone)));
        }
        // A token bound to no pod (`kubectl create token`) needs only its ServiceAccount.
        let mut unbound = request();
        unbound.pod = None;
        let (_, claims) = s.issue(&unbound, 1_000).unwrap();
        let account_only = Bindings {
            account_uid: Some("sa-1"),
            pod_uid: None,
        };
        assert_eq!(check(&claims, 2_000, &account_only), Ok(()));
    }

    #[test]
    fn tokens_are_replaced_at_80_percent_of_their_life_or_after_a_day() {
        assert!(!needs_refresh(1_000, 4_600, 1_000));
        assert!(!needs_refresh(1_000, 4_600, 3_879));
        assert!(needs_refresh(1_000, 4_600, 3_880));
        assert!(needs_refresh(1_000, 4_600, 9_999));
        let year = 365 * 86_400;
        assert!(!needs_refresh(0, year, 86_399));
        assert!(needs_refresh(0, year, 86_400));
    }

    #[test]
    fn the_key_is_kept_in_the_data_dir_with_mode_0600() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let a = Signer::load_or_create(dir.path(), ISSUER.into()).unwrap();
        let b = Signer::load_or_create(dir.path(), ISSUER.into()).unwrap();
        assert_eq!(a.kid, b.kid);
        let mode = std::fs::metadata(dir.path().join("service-account.key"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        std::fs::write(dir.path().join("service-account.key"), b"junk").unwrap();
        assert!(matches!(
            Signer::load_or_create(dir.path(), ISSUER.into()),
            Err(KeyError::Invalid(_))
        ));
    }
}

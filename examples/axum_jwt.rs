//! JWT: an auth middleware verifies the token, the limiter takes the user
//! and the tier from its claims.
//!
//! ```sh
//! cargo run --example axum_jwt            # a self-test run, then exits
//! cargo run --example axum_jwt -- --serve # keeps serving; prints tokens for curl
//! ```
//!
//! The auth middleware runs first (it is the outer layer), verifies an
//! HS256 `Authorization: Bearer` token with `jsonwebtoken`, and puts the
//! claims into the request extensions; the limiter reads them with
//! `identifier_parts_fn`. An invalid token is answered 401 before the
//! limiter; a request without a token is limited on the free plan by its
//! address. The plan is a claim the server signed, so a client cannot pick
//! its own. The self-test run checks every row it prints and exits with
//! status 1 if one differs.
//!
//! `jsonwebtoken` is built without its crypto backends (`rust_crypto` also
//! compiles RSA, ECDSA and Ed25519, `aws_lc_rs` compiles C); the HS256-only
//! provider at the end of this file uses RustCrypto's `hmac` and `sha2`.

use std::process::ExitCode;
use std::sync::Arc;

use axum::extract::{Request, State};
use axum::middleware::{Next, from_fn_with_state};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Extension, Router};
use http::StatusCode;
use jsonwebtoken::{Algorithm, DecodingKey, EncodingKey, Header, Validation};
use serde::{Deserialize, Serialize};
use tower_rate_tier::{Quota, RateTier, TierIdentity, TierLimitLayer};
use tower_rate_tier_examples::{Client, SelfTest, serve_axum, serve_forever, serve_mode, want};

/// The claims our tokens carry: the user, their plan, the expiry.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Claims {
    sub: String,
    plan: String,
    exp: u64,
}

struct Keys {
    decoding: DecodingKey,
    validation: Validation,
}

/// Verifies a bearer token, if any, and leaves its claims for the limiter
/// and the handlers.
async fn authenticate(State(keys): State<Arc<Keys>>, mut request: Request, next: Next) -> Response {
    let token = request
        .headers()
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    if let Some(token) = token {
        match jsonwebtoken::decode::<Claims>(token, &keys.decoding, &keys.validation) {
            Ok(data) => {
                request.extensions_mut().insert(data.claims);
            }
            Err(error) => {
                return (StatusCode::UNAUTHORIZED, format!("invalid token: {error}\n")).into_response();
            }
        }
    }
    next.run(request).await
}

async fn me(claims: Option<Extension<Claims>>) -> String {
    match claims {
        Some(Extension(claims)) => format!("{} on the {} plan\n", claims.sub, claims.plan),
        None => "anonymous\n".to_owned(),
    }
}

fn app(secret: &[u8]) -> Router {
    let tiers = RateTier::builder()
        .tier("free", Quota::per_minute(3))
        .tier("pro", Quota::per_hour(1_000))
        .default_tier("free") // no token: free, keyed by address; unknown plan: free
        .build();
    let limiter = TierLimitLayer::new(tiers).identifier_parts_fn(|parts| {
        let claims = parts.extensions.get::<Claims>()?;
        Some(TierIdentity::new(&claims.sub, claims.plan.as_str()))
    });
    let keys = Arc::new(Keys {
        decoding: DecodingKey::from_secret(secret),
        validation: Validation::new(Algorithm::HS256), // checks `exp`
    });

    Router::new()
        .route("/me", get(me))
        .layer(limiter)
        .layer(from_fn_with_state(keys, authenticate)) // outermost: runs first
}

fn token(secret: &[u8], sub: &str, plan: &str, exp: u64) -> String {
    let claims = Claims {
        sub: sub.to_owned(),
        plan: plan.to_owned(),
        exp,
    };
    jsonwebtoken::encode(
        &Header::new(Algorithm::HS256),
        &claims,
        &EncodingKey::from_secret(secret),
    )
    .expect("signing a token")
}

#[tokio::main]
async fn main() -> ExitCode {
    hs256::install();
    let secret = b"an example secret; load yours from the environment";
    let (addr, server) = serve_axum(app(secret)).await;
    println!("serving on http://{addr} (free: 3 requests/minute, pro: 1,000/hour)\n");

    let in_an_hour = jsonwebtoken::get_current_timestamp() + 3600;
    let alice = format!("Bearer {}", token(secret, "alice", "free", in_an_hour));
    let bob = format!("Bearer {}", token(secret, "bob", "pro", in_an_hour));
    let forged = format!(
        "Bearer {}",
        token(b"another secret", "mallory", "pro", in_an_hour)
    );
    let expired = format!("Bearer {}", token(secret, "carol", "pro", in_an_hour - 7200));

    if serve_mode() {
        println!("try (tokens valid for an hour):");
        println!("  curl -i -H 'authorization: {alice}' http://{addr}/me");
        println!("  curl -i -H 'authorization: {bob}' http://{addr}/me");
        println!("\nCtrl-C to stop.");
        serve_forever(server).await;
        return ExitCode::SUCCESS;
    }

    let client = Client::new(addr);
    let mut test = SelfTest::new();
    let as_alice = [("authorization", alice.as_str())];
    for remaining in ["2", "1", "0"] {
        test.row(
            "GET /me",
            "alice (free)",
            &client.get("/me", &as_alice).await,
            want(200, remaining, "-"),
        );
    }
    // 3 a minute: a unit comes back every 20 s
    test.row(
        "GET /me",
        "alice (free)",
        &client.get("/me", &as_alice).await,
        want(429, "0", "20"),
    );
    let as_bob = [("authorization", bob.as_str())];
    for remaining in ["999", "998"] {
        test.row(
            "GET /me",
            "bob (pro)",
            &client.get("/me", &as_bob).await,
            want(200, remaining, "-"),
        );
    }
    // a token signed with another key, or expired, never reaches the limiter
    let reply = client.get("/me", &[("authorization", &forged)]).await;
    test.row("GET /me", "forged token", &reply, want(401, "-", "-"));
    let reply = client.get("/me", &[("authorization", &expired)]).await;
    test.row("GET /me", "expired token", &reply, want(401, "-", "-"));
    test.row(
        "GET /me",
        "no token",
        &client.get("/me", &[]).await,
        want(200, "2", "-"),
    );
    let reply = client.get("/me", &as_bob).await;
    let says = String::from_utf8_lossy(&reply.body).trim().to_owned();
    println!("\nbob's /me says: {says}");
    test.equal("bob's /me", says.as_str(), "bob on the pro plan");
    println!("alice's 4th request in a minute is refused (429); bad tokens never reach the limiter (401).");
    server.abort();
    test.finish()
}

/// An HS256-only crypto provider for `jsonwebtoken`.
mod hs256 {
    use hmac::{Hmac, KeyInit, Mac};
    use jsonwebtoken::crypto::{CryptoProvider, JwkUtils, JwtSigner, JwtVerifier};
    use jsonwebtoken::errors::{ErrorKind, Result as JwtResult};
    use jsonwebtoken::signature::{Error, Signer, Verifier};
    use jsonwebtoken::{Algorithm, DecodingKey, EncodingKey};
    use sha2::Sha256;

    struct Hs256(Hmac<Sha256>);

    impl Hs256 {
        fn new(algorithm: &Algorithm, secret: JwtResult<&[u8]>) -> JwtResult<Box<Self>> {
            if *algorithm != Algorithm::HS256 {
                return Err(ErrorKind::InvalidAlgorithm.into());
            }
            let mac = Hmac::new_from_slice(secret?).map_err(|_| ErrorKind::InvalidKeyFormat)?;
            Ok(Box::new(Hs256(mac)))
        }
    }

    impl Signer<Vec<u8>> for Hs256 {
        fn try_sign(&self, message: &[u8]) -> Result<Vec<u8>, Error> {
            let mut mac = self.0.clone();
            mac.update(message);
            Ok(mac.finalize().into_bytes().to_vec())
        }
    }

    impl Verifier<Vec<u8>> for Hs256 {
        fn verify(&self, message: &[u8], signature: &Vec<u8>) -> Result<(), Error> {
            let mut mac = self.0.clone();
            mac.update(message);
            mac.verify_slice(signature).map_err(|_| Error::new()) // constant time
        }
    }

    impl JwtSigner for Hs256 {
        fn algorithm(&self) -> Algorithm {
            Algorithm::HS256
        }
    }

    impl JwtVerifier for Hs256 {
        fn algorithm(&self) -> Algorithm {
            Algorithm::HS256
        }
    }

    static PROVIDER: CryptoProvider = CryptoProvider {
        signer_factory: |algorithm: &Algorithm, key: &EncodingKey| -> JwtResult<Box<dyn JwtSigner>> {
            Ok(Hs256::new(algorithm, key.try_get_hmac_secret())?)
        },
        verifier_factory: |algorithm: &Algorithm, key: &DecodingKey| -> JwtResult<Box<dyn JwtVerifier>> {
            Ok(Hs256::new(algorithm, key.try_get_hmac_secret())?)
        },
        jwk_utils: JwkUtils::new_unimplemented(),
    };

    /// Makes this provider the process's default (once, before the first
    /// token is signed or verified).
    pub(crate) fn install() {
        let _ = PROVIDER.install_default();
    }
}

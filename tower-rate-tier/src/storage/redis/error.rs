//! Redis failures as [`StorageError`]s that say what was attempted.
//!
//! The message names the attempt (a charge, a peek, a refund, loading the
//! script, connecting), the cause in a few words, and, on a Cluster, the node
//! when redis-rs names one (a redirection). It never carries a key or a user
//! id: the server's reply text can (an `unknown command` reply echoes the
//! command's first arguments, keys among them), so it stays in the
//! redis-rs error, which is the [`source`](std::error::Error::source).

use std::time::Duration;

use redis::{ErrorKind, RedisError, ServerErrorKind};

use super::super::{StorageError, StorageErrorKind};

/// What the storage was doing when Redis failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Attempt {
    /// A decision that charges.
    Charge,
    /// A decision that charges nothing.
    Peek,
    /// A refund.
    Refund,
    /// Sending the script itself (`EVAL`) after the server did not know it.
    LoadScript,
    /// Connecting to one server.
    Connect,
    /// Connecting to a Redis Cluster.
    ConnectCluster,
    /// Making a client from the configuration (before any I/O).
    Configure,
    /// Taking a slot of a concurrency limit with the charge of the bands.
    Acquire,
    /// Giving back a slot of a concurrency limit.
    Release,
}

impl Attempt {
    fn what(self) -> &'static str {
        match self {
            Attempt::Charge => "Redis charge",
            Attempt::Peek => "Redis peek",
            Attempt::Refund => "Redis refund",
            Attempt::LoadScript => "loading the rate-limit script into Redis (EVAL)",
            Attempt::Connect => "connecting to Redis",
            Attempt::ConnectCluster => "connecting to the Redis Cluster",
            Attempt::Configure => "configuring the Redis client",
            Attempt::Acquire => "Redis concurrency slot and charge",
            Attempt::Release => "Redis release of a concurrency slot",
        }
    }

    /// What a call cut short by our timeout may have done all the same.
    fn maybe_done(self) -> &'static str {
        match self {
            Attempt::Charge | Attempt::LoadScript => " (the request may still have been counted)",
            Attempt::Acquire => " (the request may still have been counted and its slot taken)",
            Attempt::Refund => " (the refund may still have been made)",
            _ => "",
        }
    }
}

/// `attempt` got no answer within `after` (our own timeout).
pub(super) fn timeout_error(attempt: Attempt, after: Duration) -> StorageError {
    StorageError::new(
        StorageErrorKind::Timeout,
        format!(
            "{} got no answer within {after:?}{}",
            attempt.what(),
            attempt.maybe_done()
        ),
    )
}

/// One decision of a batch failed on the server (the others were decided):
/// `reply` is the error text the script gave for it, which becomes the
/// source (it is the server's, and may name a key).
pub(super) fn item_error(attempt: Attempt, reply: &str) -> StorageError {
    let error = RedisError::from((
        ErrorKind::Server(ServerErrorKind::ResponseError),
        "An error was signalled by the server",
        reply.to_owned(),
    ));
    let code = reply.split_whitespace().next().unwrap_or("?");
    let kind = if cannot_write(code) || cluster_down_in_script(code, reply) {
        StorageErrorKind::Unavailable
    } else {
        StorageErrorKind::Other
    };
    let ours = reply
        .find("tower-rate-tier: ")
        .map(|at| format!(" {}", &reply[at..]))
        .unwrap_or_default();
    let message = format!(
        "{} failed inside a batch of decisions: the server replied {code}{ours}",
        attempt.what()
    );
    StorageError::with_source(kind, message, error)
}

/// Whether a reply's error code says the server cannot carry out a write
/// now, whatever the command: it is out of memory under `noeviction`
/// (`OOM`), a replica (`READONLY`), busy with a script (`BUSY`), loading its
/// data (`LOADING`), without its master or cluster (`MASTERDOWN`,
/// `CLUSTERDOWN`), without the replicas `min-replicas-to-write` asks for
/// (`NOREPLICAS`), or unable to persist (`MISCONF`). Such a server is
/// unavailable for the limiter, as an unreachable one is: the fallback
/// answers, or `OnStorageError` applies.
fn cannot_write(code: &str) -> bool {
    matches!(
        code,
        "OOM" | "READONLY" | "BUSY" | "LOADING" | "MASTERDOWN" | "CLUSTERDOWN" | "NOREPLICAS" | "MISCONF"
    )
}

/// Whether a script's reply says a command in it met a cluster that is
/// down (`ERR Script attempted to execute a command while the cluster is
/// down`, `... down and readonly`): a batch's script declares no keys, so
/// the server runs it and each key it touches fails so, where a decision of
/// its own would get `CLUSTERDOWN`. The same outage, so the same kind.
fn cluster_down_in_script(code: &str, reply: &str) -> bool {
    code == "ERR" && reply.contains("while the cluster is down")
}

/// `attempt` failed with `error`, which becomes the source.
pub(super) fn redis_error(attempt: Attempt, error: RedisError) -> StorageError {
    let kind = kind_of(&error);
    let node = match error.redirect_node() {
        Some((node, _slot)) => format!(" (node {node})"),
        None => String::new(),
    };
    let message = format!("{} failed: {}{node}", attempt.what(), cause(&error));
    StorageError::with_source(kind, message, error)
}

fn kind_of(e: &RedisError) -> StorageErrorKind {
    if e.is_timeout() {
        StorageErrorKind::Timeout
    } else if e.is_io_error()
        || e.is_connection_refusal()
        || e.is_connection_dropped()
        || matches!(
            e.kind(),
            ErrorKind::ClusterConnectionNotFound
                | ErrorKind::Server(
                    ServerErrorKind::ClusterDown
                        | ServerErrorKind::MasterDown
                        // a redirection still unanswered after the driver's
                        // retry: the node serving the key is out of reach
                        | ServerErrorKind::Moved
                        | ServerErrorKind::Ask
                        | ServerErrorKind::TryAgain
                        | ServerErrorKind::BusyLoading
                )
        )
        || e.code().is_some_and(cannot_write)
    {
        StorageErrorKind::Unavailable
    } else {
        StorageErrorKind::Other
    }
}

/// The cause in our own words (and the server's error code, never its text,
/// except the script's own messages, which name no key).
fn cause(e: &RedisError) -> String {
    if e.is_timeout() {
        return "the connection timed out".into();
    }
    if e.is_connection_refusal() {
        return "connection refused".into();
    }
    match e.kind() {
        ErrorKind::Server(ServerErrorKind::NoPerm) => {
            // Redis's own templates ("... to run the 'eval' command", "... to
            // access one of the keys used as arguments") name no key.
            let what = e
                .detail()
                .filter(|d| d.starts_with("this user has no permissions to "))
                .unwrap_or("");
            format!(
                "permission denied by the server's ACL (NOPERM {what}): see the module docs for \
                 the permissions the storage needs"
            )
        }
        ErrorKind::AuthenticationFailed => "authentication failed".into(),
        ErrorKind::InvalidClientConfig => "invalid client configuration (check the URL)".into(),
        ErrorKind::ClusterConnectionNotFound => "no connection to the node that serves the key".into(),
        ErrorKind::Io if e.is_connection_dropped() => "connection lost".into(),
        ErrorKind::Io => "I/O error".into(),
        // a command the script runs, denied by the caller's ACL
        ErrorKind::Server(ServerErrorKind::ResponseError)
            if e.detail().is_some_and(|d| d.contains("can't run this command")) =>
        {
            "permission denied by the server's ACL for a command the script runs: see the module \
             docs for the permissions the storage needs"
                .into()
        }
        ErrorKind::Server(_) | ErrorKind::Extension => {
            let code = e.code().unwrap_or("?");
            match e.detail().filter(|d| d.starts_with("tower-rate-tier: ")) {
                Some(ours) => format!("the server replied {code} {ours}"),
                None => format!("the server replied {code}"),
            }
        }
        _ => e.category().to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use std::error::Error as _;

    use super::*;

    #[test]
    fn the_message_says_what_was_attempted_and_keeps_the_source() {
        let refused = RedisError::from(std::io::Error::from(std::io::ErrorKind::ConnectionRefused));
        let e = redis_error(Attempt::Charge, refused);
        assert_eq!(e.kind(), StorageErrorKind::Unavailable);
        assert_eq!(
            e.to_string(),
            "rate-limit storage unavailable: Redis charge failed: connection refused"
        );
        let source = e.source().and_then(|s| s.downcast_ref::<RedisError>());
        assert!(
            source.is_some_and(RedisError::is_connection_refusal),
            "{source:?}"
        );
    }

    #[test]
    fn a_server_reply_names_its_code_but_never_echoes_a_key() {
        let unknown = RedisError::from((
            ErrorKind::Server(ServerErrorKind::ResponseError),
            "An error was signalled by the server",
            "unknown command 'EVALSHA', with args beginning with: 'abc' '1' 'trt:{0f}:w60:q10'".to_owned(),
        ));
        let e = redis_error(Attempt::Refund, unknown);
        assert_eq!(e.kind(), StorageErrorKind::Other);
        assert!(!e.to_string().contains("trt:"), "{e}");
        assert!(
            e.to_string()
                .contains("Redis refund failed: the server replied ERR"),
            "{e}"
        );
        // the script's own messages are kept
        let ours = RedisError::from((
            ErrorKind::Server(ServerErrorKind::ResponseError),
            "An error was signalled by the server",
            "tower-rate-tier: bad time".to_owned(),
        ));
        let e = redis_error(Attempt::Peek, ours);
        assert!(
            e.to_string()
                .ends_with("Redis peek failed: the server replied ERR tower-rate-tier: bad time")
        );
    }

    #[test]
    fn acl_refusals_say_so() {
        let server = |kind, detail: &str| {
            RedisError::from((
                ErrorKind::Server(kind),
                "An error was signalled by the server",
                detail.to_owned(),
            ))
        };
        let e = redis_error(
            Attempt::Charge,
            server(
                ServerErrorKind::NoPerm,
                "this user has no permissions to run the 'evalsha' command",
            ),
        );
        assert!(
            e.to_string()
                .contains("ACL (NOPERM this user has no permissions to run the 'evalsha' command)"),
            "{e}"
        );
        let e = redis_error(
            Attempt::Charge,
            server(
                ServerErrorKind::ResponseError,
                "The user executing the script can't run this command or subcommand script: 0a1b",
            ),
        );
        assert!(e.to_string().contains("ACL for a command the script runs"), "{e}");
    }

    #[test]
    fn a_failed_decision_of_a_batch_names_the_code_never_the_text() {
        let e = item_error(
            Attempt::Charge,
            "WRONGTYPE Operation against a key holding the wrong kind of value trt:{ab}:w1",
        );
        assert_eq!(e.kind(), StorageErrorKind::Other);
        assert_eq!(
            e.to_string(),
            "rate-limit storage failed: Redis charge failed inside a batch of decisions: the \
             server replied WRONGTYPE"
        );
        let e = item_error(Attempt::Refund, "ERR tower-rate-tier: bad band arguments");
        assert!(
            e.to_string()
                .ends_with("replied ERR tower-rate-tier: bad band arguments"),
            "{e}"
        );
        assert!(e.source().is_some());
    }

    #[test]
    fn replies_that_mean_the_server_cannot_write_are_unavailable() {
        // as redis-rs parses a reply whose code it has no variant for
        let reply =
            |code: &str| redis::make_extension_error(code.to_owned(), Some("the server's text".into()));
        for code in [
            "OOM",
            "READONLY",
            "BUSY",
            "LOADING",
            "MASTERDOWN",
            "CLUSTERDOWN",
            "NOREPLICAS",
            "MISCONF",
        ] {
            let e = redis_error(Attempt::Charge, reply(code));
            assert_eq!(e.kind(), StorageErrorKind::Unavailable, "{code}: {e}");
            assert!(e.to_string().contains(&format!("replied {code}")), "{e}");
            let item = item_error(Attempt::Charge, &format!("{code} the server's text trt:{{ab}}"));
            assert_eq!(item.kind(), StorageErrorKind::Unavailable, "{code}: {item}");
            assert!(!item.to_string().contains("trt:"), "{item}");
        }
        // a batch's script touching a key of a cluster that is down
        for text in [
            "ERR Script attempted to execute a command while the cluster is down",
            "ERR Script attempted to execute a command while the cluster is down and readonly",
        ] {
            let item = item_error(Attempt::Charge, text);
            assert_eq!(item.kind(), StorageErrorKind::Unavailable, "{text}: {item}");
        }
        for code in ["ERR", "WRONGTYPE", "NOSCRIPT", "NOPERM", "EXECABORT"] {
            assert_eq!(
                redis_error(Attempt::Charge, reply(code)).kind(),
                StorageErrorKind::Other,
                "{code}"
            );
            assert_eq!(
                item_error(Attempt::Charge, code).kind(),
                StorageErrorKind::Other,
                "{code}"
            );
        }
    }

    #[test]
    fn a_redirection_names_the_node() {
        let moved = RedisError::from((
            ErrorKind::Server(ServerErrorKind::Moved),
            "An error was signalled by the server",
            "3999 127.0.0.1:6381".to_owned(),
        ));
        let e = redis_error(Attempt::Charge, moved);
        assert!(e.to_string().ends_with("(node 127.0.0.1:6381)"), "{e}");
        assert_eq!(e.kind(), StorageErrorKind::Unavailable);
    }

    #[test]
    fn a_timeout_says_what_may_have_happened() {
        let e = timeout_error(Attempt::Charge, Duration::from_millis(250));
        assert_eq!(e.kind(), StorageErrorKind::Timeout);
        assert_eq!(
            e.to_string(),
            "rate-limit storage timed out: Redis charge got no answer within 250ms \
             (the request may still have been counted)"
        );
        let e = timeout_error(Attempt::Peek, Duration::from_millis(250));
        assert!(e.to_string().ends_with("within 250ms"), "{e}");
    }
}

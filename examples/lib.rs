//! Runnable examples of tower-rate-tier; see the `[[example]]` entries of this package.

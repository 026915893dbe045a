//! Property tests of the header rendering.

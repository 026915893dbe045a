//! Bad input through the layer.

//! The checkpoint coordinator (in construction).

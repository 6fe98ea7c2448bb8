//! The macOS backend (mach2), built by another engineer.

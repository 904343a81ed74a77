//! The ContainerPool: a pure scheduling core and the actor that carries out its effects.

pub mod actor;
mod hand_off;
pub(crate) mod live;
pub mod status;

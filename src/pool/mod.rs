//! The ContainerPool: a pure scheduling core and the actor that carries out its effects.

pub mod actor;
pub(crate) mod live;
pub mod status;

//! The `#[idempotent]` attribute of the `idempotency/v1` A2A extension.
//!
//! Use it through the `idem` facade crate, which re-exports it next to the runtime the
//! expansion calls into.

mod args;
mod expand;
mod method;

use proc_macro::TokenStream;

/// Makes a jsonrpsee server method idempotent by wrapping its body in the idempotency guard.
///
/// Put it on a method of an `impl ...Server for ...` block whose `#[method(...)]` has
/// `with_extensions`; the method takes an `ext: &Extensions` parameter and returns
/// `RpcResult<Replayable<T>>` (one answer, replayed byte for byte) or
/// `RpcResult<EventStream<T>>` (an event stream, recorded and replayed). It works on an
/// `async fn` of an `#[async_trait]` impl (jsonrpsee's async methods need one), whether it runs
/// before or after `#[async_trait]` desugars the method.
///
/// Not in the `#[rpc]` trait: jsonrpsee drops the attributes of trait methods. A governed
/// method that answers without this guard is refused at run time with
/// `IDEMPOTENCY_METHOD_NOT_GUARDED`.
///
/// The only argument is `crate = "path"`, for when `idem` is reachable neither as `::idem`
/// nor under the name the application's `Cargo.toml` gives it (a renamed dependency is found).
#[proc_macro_attribute]
pub fn idempotent(attr: TokenStream, item: TokenStream) -> TokenStream {
    let item = proc_macro2::TokenStream::from(item);
    let expanded = args::parse(attr.into()).and_then(|args| {
        let method = method::parse(item.clone())?;
        Ok(method.map(|method| expand::expand(&args, method)))
    });
    match expanded {
        Ok(Some(tokens)) => tokens.into(),
        // A signature that does not parse: the compiler's error on it is the one to read.
        Ok(None) => item.into(),
        // The item is kept as written so that the one mistake reported here is the only
        // error: a vanished method would add "missing item" errors on the impl.
        Err(err) => {
            let mut tokens = item;
            tokens.extend(err.to_compile_error());
            tokens.into()
        }
    }
}

//! The workspace README's "Use with kube-rs" block is `ignore`d there (its doctests run in
//! workqueue-tokio, which has no kube): this checks that it is the example's code, verbatim, so
//! that it compiles with the example and does not rot.

#[test]
fn the_readme_kube_block_is_the_examples_code() {
    let readme = include_str!("../../README.md");
    let example = include_str!("../examples/counter/main.rs");
    let section = readme
        .split("## Use with kube-rs")
        .nth(1)
        .expect("the README has a \"Use with kube-rs\" section");
    let block = section
        .split("```rust,ignore\n")
        .nth(1)
        .and_then(|rest| rest.split("```").next())
        .expect("the section has a rust,ignore block");
    assert!(
        block.lines().count() > 20,
        "the block is the controller's error policy and wiring"
    );
    assert!(
        example.contains(block),
        "the README's kube-rs block differs from examples/counter/main.rs:\n{block}"
    );
}

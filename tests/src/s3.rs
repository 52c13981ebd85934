//! The S3-compatible server `.ci/run` starts for the tests (`BERTH_TEST_S3_ENDPOINT`).

use rand::RngCore;

/// The S3 server's settings for a fresh bucket (`BERTH_OBJECT_STORE` first, then the
/// `AWS_*` variables), or None — after saying why — when no server was started (outside CI).
pub async fn settings(test: &str) -> Option<Vec<(String, String)>> {
    let Ok(endpoint) = std::env::var("BERTH_TEST_S3_ENDPOINT") else {
        eprintln!(
            "SKIPPED {test} against S3: BERTH_TEST_S3_ENDPOINT is not set (.ci/run starts an \
             S3-compatible server and sets it); the local-directory variant ran"
        );
        return None;
    };
    let bucket = format!("berth-test-{}", rand::rng().next_u64());
    // An S3-compatible test server takes an unsigned bucket creation.
    let resp = reqwest::Client::new()
        .put(format!("{endpoint}/{bucket}"))
        .send()
        .await
        .expect("create bucket");
    assert!(resp.status().is_success(), "creating bucket: {}", resp.status());
    Some(vec![
        ("BERTH_OBJECT_STORE".into(), format!("s3://{bucket}/berth/blobs")),
        ("AWS_ENDPOINT_URL".into(), endpoint),
        ("AWS_ACCESS_KEY_ID".into(), "test-access-key".into()),
        ("AWS_SECRET_ACCESS_KEY".into(), "test-secret-key".into()),
        ("AWS_REGION".into(), "us-east-1".into()),
    ])
}

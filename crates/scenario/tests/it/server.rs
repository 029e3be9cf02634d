//! The shipped scenarios through a real server's agents API (`HttpBackend`): the same
//! transcript as in process, the same working-memory figures, ephemeral agents deleted at
//! the end, and a server restarted between every two phases resumes each agent warm from
//! its persisted, pinned session.

use crate::common;
use std::net::SocketAddr;
use std::time::Duration;

use common::*;
use engram_kv::{KvFormat, KvLayout, KvPool};
use engram_scenario::{run, HttpBackend, Progress, RunOptions};
use engram_server::{DiskConfig, Server, ServerConfig};

/// A server on `addr` (port 0: any) until `stop` fires; its address and thread.
fn serve(addr: SocketAddr, config: ServerConfig) -> (SocketAddr, tokio::sync::oneshot::Sender<()>, std::thread::JoinHandle<()>) {
    let model = fixture().2.clone();
    let pool = KvPool::new(KvLayout::of(&model.config), KvFormat::F32, 256 << 20);
    let (tx, rx) = std::sync::mpsc::channel();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let thread = std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
        rt.block_on(async move {
            let listener = tokio::net::TcpListener::bind(addr).await.unwrap();
            tx.send(listener.local_addr().unwrap()).unwrap();
            let server = Server::start(model, pool, config);
            server.serve(listener, async { drop(stopped.await) }, Duration::from_secs(5)).await.unwrap();
        });
    });
    (rx.recv().unwrap(), stop, thread)
}

fn agents(addr: SocketAddr) -> Vec<String> {
    let body = ureq::get(&format!("http://{addr}/v1/agents")).call().unwrap().body_mut().read_to_string().unwrap();
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    v["data"].as_array().unwrap().iter().map(|a| a["id"].as_str().unwrap().to_string()).collect()
}

#[test]
fn a_scenario_through_the_agents_api_equals_the_in_process_run() {
    let scenario = shipped("prisoners-dilemma");
    let (addr, stop, thread) = serve("127.0.0.1:0".parse().unwrap(), ServerConfig::new("tiny"));
    let mut backend = HttpBackend::new(&format!("http://{addr}"));
    let served = run(&scenario, &mut backend, &options(), &mut |_| {}).unwrap();
    assert_working_memory(&served);
    let local = run_in_process(&scenario, true, None, false);
    assert_eq!(served.transcript(), local.transcript());
    let mut left = agents(addr);
    left.sort();
    assert_eq!(
        left,
        ["scn-prisoners-dilemma-danny", "scn-prisoners-dilemma-marco", "scn-prisoners-dilemma-warden"],
        "the analyst is ephemeral"
    );
    stop.send(()).unwrap();
    thread.join().unwrap();
}

#[test]
fn a_server_restarted_between_phases_resumes_every_agent_warm() {
    let scenario = shipped("gossip");
    let dir = tempfile::tempdir().unwrap();
    let config = || {
        let mut c = ServerConfig::new("tiny");
        c.sessions.disk = Some(DiskConfig {
            dir: dir.path().join("kv"),
            budget_bytes: 256 << 20,
            policy: engram_kv::EvictionPolicy::Lru,
            tenant_share_bytes: None,
        });
        c
    };
    let (addr, stop, thread) = serve("127.0.0.1:0".parse().unwrap(), config());
    let mut server = Some((stop, thread));
    let mut restarts = 0;
    let mut backend = HttpBackend::new(&format!("http://{addr}"));
    let opts = RunOptions { run_id: "restarts".into(), ..options() };
    let report = run(&scenario, &mut backend, &opts, &mut |p| {
        if let Progress::Phase(phase) = p {
            if phase.name != scenario.phases[0].name {
                let (stop, thread) = server.take().unwrap();
                stop.send(()).unwrap();
                thread.join().unwrap();
                let (_, stop, thread) = serve(addr, config());
                server = Some((stop, thread));
                restarts += 1;
            }
        }
    })
    .unwrap();
    assert_eq!(restarts, scenario.phases.len() - 1);
    assert_working_memory(&report);
    assert_eq!(report.transcript(), run_in_process(&scenario, true, None, false).transcript());
    let (stop, thread) = server.take().unwrap();
    stop.send(()).unwrap();
    thread.join().unwrap();
}

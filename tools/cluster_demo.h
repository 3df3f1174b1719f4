// The cross-node demo's three processes, as `kvtier` subcommands (scripts/cluster-demo.sh and the
// `demo` service of docker-compose.yml run them, each against a different node's socket):
//
//   kvtier --socket NODE1 cluster-demo-prefill [SEED]        A: put a prompt, snapshot it, print
//                                                               "snapshot NODE:ID"
//   kvtier --socket NODE2 cluster-demo-decode NODE:ID [SEED] B: restore it from NODE, check the
//                                                               bytes, decode a few tokens
//   kvtier --socket NODE3 cluster-demo-lookup [SEED]         C: look up a prompt sharing A's
//                                                               prefix: a remote hit
//
// The KV is synthetic (tools/synthetic_kv.h), derived from the tokens, so each process knows
// what A computed from SEED alone; the same SEED must be given to all three. A fresh SEED per
// run keeps a re-run against the same cluster from hitting what the last run left cached.
// Each returns the process exit status (0: the step did what it says) and prints one line per
// step on stdout, errors on stderr.
#pragma once

#include <string>
#include <vector>

namespace kvtier {

// `args` are the subcommand's own arguments, after its name.
int clusterDemoPrefill(const std::string& socket, const std::vector<std::string>& args);
int clusterDemoDecode(const std::string& socket, const std::vector<std::string>& args);
int clusterDemoLookup(const std::string& socket, const std::vector<std::string>& args);

}  // namespace kvtier

// Cluster DNS of the test node (tests/cluster/node.py): CoreDNS from its Go module, built with the plugins the
// node's Corefile uses (Service and pod names from the API server, its listening address, health and readiness)
// instead of the ~60 of the default build, whose cloud SDKs would only lengthen the cold build.
package main

import (
	_ "github.com/coredns/coredns/core/dnsserver"
	"github.com/coredns/coredns/coremain"
	_ "github.com/coredns/coredns/plugin/bind"
	_ "github.com/coredns/coredns/plugin/cache"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/health"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/log"
	_ "github.com/coredns/coredns/plugin/ready"
)

func main() {
	coremain.Run()
}

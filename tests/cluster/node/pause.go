// The pod sandbox ("pause") process of the test node (tests/cluster/node.py): no registry is reachable here, so
// the sandbox image containerd names in its sandbox_image is built from this file. It holds the pod's namespaces,
// reaps orphans as PID 1 (a pod sharing its process namespace), and exits 0 on SIGINT or SIGTERM.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	signals := make(chan os.Signal, 16)
	signal.Notify(signals, syscall.SIGINT, syscall.SIGTERM, syscall.SIGCHLD)
	for s := range signals {
		if s != syscall.SIGCHLD {
			os.Exit(0)
		}
		for {
			pid, err := syscall.Wait4(-1, nil, syscall.WNOHANG, nil)
			if pid <= 0 || err != nil {
				break
			}
		}
	}
}

// Command roam-certs writes a throwaway certificate authority and
// certificates for trying roam with mutual TLS on one machine (`make
// certs`): ca.pem; for each node name, <name>.pem and <name>-key.pem,
// naming that node (a node's TLS identity is its name) and the hosts;
// and client.pem / client-key.pem, naming the hosts and no node, for
// processes that talk to nodes without being one. Not for production:
// issue certificates from your own CA.
package main

import (
	"flag"
	"fmt"
	"os"
	"strings"

	"github.com/roamactors/roam/internal/devca"
)

// demoNodes are the names the demo and the chat example give their nodes.
const demoNodes = "gateway,node,node-1,node-2,node-3,node-4,node-5,node-6,node-7,node-8,node-9"

func main() {
	dir := flag.String("dir", "certs", "directory to write into (made if missing)")
	hosts := flag.String("hosts", "127.0.0.1,localhost", "hosts every certificate names, comma-separated")
	nodes := flag.String("nodes", demoNodes, "names of the nodes to write a certificate for, comma-separated")
	flag.Parse()
	if err := write(*dir, strings.Split(*hosts, ","), strings.Split(*nodes, ",")); err != nil {
		fmt.Fprintln(os.Stderr, "roam-certs:", err)
		os.Exit(1)
	}
	fmt.Printf("wrote %s/ca.pem, a certificate for each of %d nodes (<name>.pem) and client.pem (valid ten days)\n", *dir, len(strings.Split(*nodes, ",")))
}

func write(dir string, hosts, nodes []string) error {
	ca, err := devca.New("roam demo CA")
	if err != nil {
		return err
	}
	for _, n := range nodes {
		if n == "" || n == "client" {
			return fmt.Errorf("node name %q: not a node's", n)
		}
		if _, err := ca.WriteNode(dir, n, hosts...); err != nil {
			return err
		}
	}
	_, err = ca.WriteClient(dir, "client", hosts...)
	return err
}

// Command roam-certs writes a throwaway certificate authority and one node
// certificate for trying roam with mutual TLS on one machine (`make
// certs`): ca.pem, node.pem and node-key.pem, for 127.0.0.1 and localhost.
// Every node and client of the demo uses the same certificate. Not for
// production: issue certificates from your own CA.
package main

import (
	"flag"
	"fmt"
	"os"
	"strings"

	"github.com/roamactors/roam/internal/devca"
)

func main() {
	dir := flag.String("dir", "certs", "directory to write into (made if missing)")
	hosts := flag.String("hosts", "127.0.0.1,localhost", "hosts the node certificate names, comma-separated")
	flag.Parse()
	ca, err := devca.New("roam demo CA")
	if err == nil {
		var f devca.Files
		if f, err = ca.WriteNode(*dir, "node", strings.Split(*hosts, ",")...); err == nil {
			fmt.Printf("wrote %s, %s, %s (valid ten days)\n", f.CA, f.Cert, f.Key)
			return
		}
	}
	fmt.Fprintln(os.Stderr, "roam-certs:", err)
	os.Exit(1)
}

package meshnode

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"strconv"
	"sync"
	"sync/atomic"

	"github.com/asynkron/protoactor-go/actor"
	pcluster "github.com/asynkron/protoactor-go/cluster"
	"github.com/asynkron/protoactor-go/remote"
	"github.com/rs/zerolog"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/roamactors/roam/location"
	"github.com/roamactors/roam/roamerr"
)

// Transport is an application's actor system, with its remote (and its
// Proto.Actor cluster, if it has one), that roam's node lifecycles run on
// one after another. The application owns the system: a node lifecycle
// ending does not stop it, and a new lifecycle (after the owner lease
// ended) starts on the same system and address.
type Transport struct {
	system *actor.ActorSystem
	remote *remote.Remote
	pc     *pcluster.Cluster
	hooks  *remoteHooks
	// ownsRemote: the system had no remote; Attach started one and Stop
	// stops it.
	ownsRemote bool
	stopOnce   sync.Once
	stopped    atomic.Bool // the remote Attach started is shut down
}

// remoteHooks connects a remote configuration's guards to the node
// lifecycle that runs on it now.
type remoteHooks struct {
	node   atomic.Pointer[Node]
	link   LinkSettings
	limits Limits
	counts refusals
	// watches are the watches peers hold on this node's actors.
	watches *watchLedger
	// plainTCP: the application accepted plain TCP beyond loopback.
	plainTCP bool
}

// checkHost refuses a configuration changed, after RemoteConfig made it,
// to listen beyond loopback without TLS.
func (h *remoteHooks) checkHost(rcfg *remote.Config) error {
	return plainBeyondLoopback(rcfg.Host, rcfg.Port, h.link.Server != nil, h.plainTCP)
}

// plainBeyondLoopback refuses a node that would listen beyond loopback
// without TLS, unless the application accepted plain TCP.
func plainBeyondLoopback(host string, port int, tlsOn, plainTCP bool) error {
	if tlsOn || plainTCP || loopback(host) {
		return nil
	}
	return fmt.Errorf("%w: cluster: a node listening on %q without TLS would take any process that reaches its port "+
		"for a member; give it TLS (roam.WithTLS; `make certs` writes a test CA), or, on a network only your own processes "+
		"reach, accept plain TCP (roam.WithPlainTCP)", location.ErrInvalid, net.JoinHostPort(host, strconv.Itoa(port)))
}

// LinkSettings are what a node's chunk link takes from its remote
// configuration: the host the remote listens on and the cluster's TLS.
type LinkSettings struct {
	// Host is the host the remote listens on; the link listens there too.
	Host string
	// Server and Client are the cluster's mutual TLS, nil without TLS.
	Server, Client *tls.Config
	// Nodes are the roam nodes this node's certificate names, with TLS.
	Nodes []string
	hooks *remoteHooks
}

// Certified reports whether a peer's verified certificate names the host
// of the address it declares and the node the Location Store has there
// (as for every control message, with TLS).
func (l LinkSettings) Certified(leaf *x509.Certificate, address string) bool {
	if !certifiedFor(leaf, address) || l.hooks == nil {
		return false
	}
	g := &guardedStream{ServerStream: nopStream{}, leaf: leaf, hooks: l.hooks, declared: address}
	return g.identify() == nil
}

func (h *remoteHooks) limitOf(address string) int {
	if n := h.node.Load(); n != nil {
		return n.peerFrameBytes(address)
	}
	return MaxFrameBytes
}

// endpointWriterQueueSize is the initial length of a peer connection's
// outgoing queue (it doubles when full).
const endpointWriterQueueSize = 1024

// guardedConfigs are the remote configurations RemoteConfig made: only a
// remote on one of them has roam's frame checks, limits and TLS.
var guardedConfigs sync.Map // *remote.Config → *remoteHooks

// RemoteOptions are what a remote configuration of a roam node carries.
type RemoteOptions struct {
	Logger zerolog.Logger
	// TLS, if set, makes every connection mutual TLS (Config.TLS).
	TLS *TLS
	// PlainTCP accepts listening on an address other than loopback
	// without TLS (Config.PlainTCP).
	PlainTCP bool
	// Limits bound what peers can make the node hold (Config.Limits).
	Limits Limits
	// AdvertisedHost, if set, is the host:port peers dial.
	AdvertisedHost string
	// Options are passed to Proto.Actor's remote.Configure.
	Options []remote.ConfigOption
}

// RemoteConfig returns a Proto.Actor remote configuration for system
// listening on host:port, with roam's guards (every frame checked before
// Proto.Actor decodes it, frame limits, TLS when set). An application with
// a Proto.Actor cluster passes it to cluster.Configure; Attach refuses a
// cluster whose remote was configured otherwise.
func RemoteConfig(system *actor.ActorSystem, host string, port int, o RemoteOptions) (*remote.Config, error) {
	if err := plainBeyondLoopback(host, port, o.TLS != nil, o.PlainTCP); err != nil {
		return nil, err
	}
	unguessableIDs(system)
	var serverCreds, clientCreds credentials.TransportCredentials
	hooks := &remoteHooks{limits: o.Limits.withDefaults(), plainTCP: o.PlainTCP}
	hooks.link = LinkSettings{Host: host, hooks: hooks}
	hooks.watches = newWatchLedger(system, hooks.limits, &hooks.counts)
	if o.TLS != nil {
		h := host
		if o.AdvertisedHost != "" {
			if ah, _, err := net.SplitHostPort(o.AdvertisedHost); err == nil {
				h = ah
			}
		}
		var err error
		if hooks.link.Server, hooks.link.Client, err = o.TLS.configs(h); err != nil {
			return nil, err
		}
		leaf := hooks.link.Server.Certificates[0].Leaf
		if leaf == nil { // GODEBUG=x509keypairleaf=0; configs checked it parses
			leaf, _ = x509.ParseCertificate(hooks.link.Server.Certificates[0].Certificate[0])
		}
		hooks.link.Nodes = certNodes(leaf)
		serverCreds, clientCreds = credentials.NewTLS(hooks.link.Server), credentials.NewTLS(hooks.link.Client)
	}
	// Proto.Actor sizes each peer connection's outgoing queue for a
	// million messages up front (16 MiB of slots per peer, all scanned by
	// the collector); it grows on demand, so start it small. The caller's
	// options come after and may set it back.
	opts := append([]remote.ConfigOption{remote.WithEndpointWriterQueueSize(endpointWriterQueueSize)}, o.Options...)
	rcfg := remote.Configure(host, port, opts...)
	remoteOptions(rcfg, o.Logger, system, hooks, serverCreds, clientCreds)
	if o.AdvertisedHost != "" {
		rcfg.AdvertisedHost = o.AdvertisedHost
	}
	guardedConfigs.Store(rcfg, hooks)
	return rcfg, nil
}

// protoCluster is the system's Proto.Actor cluster, nil if it has none.
func protoCluster(system *actor.ActorSystem) (c *pcluster.Cluster) {
	defer func() {
		if recover() != nil { // GetCluster asserts on an absent extension
			c = nil
		}
	}()
	return pcluster.GetCluster(system)
}

// HasProtoCluster reports whether the system has a Proto.Actor cluster.
func HasProtoCluster(system *actor.ActorSystem) bool { return protoCluster(system) != nil }

// hasRemote reports whether the system has a Proto.Actor remote.
func hasRemote(system *actor.ActorSystem) (ok bool) {
	defer func() {
		if recover() != nil {
			ok = false
		}
	}()
	return remote.GetRemote(system) != nil
}

// Attach prepares system for roam's node lifecycles. A system that is a
// Proto.Actor cluster member must have started it (StartMember) with a
// remote configuration from RemoteConfig; roam then shares its remote.
// A system without a cluster must have no remote: Attach starts one on
// the configuration own returns (made by RemoteConfig), which Stop stops. Anything else is refused with
// NotConfigured: a remote roam did not configure lacks its guards.
func Attach(system *actor.ActorSystem, own func() (*remote.Config, error)) (*Transport, error) {
	if system == nil {
		return nil, fmt.Errorf("%w: no actor system", roamerr.ErrInvalidOperation)
	}
	if pc := protoCluster(system); pc != nil {
		v, ok := guardedConfigs.Load(pc.Config.RemoteConfig)
		if !ok {
			return nil, fmt.Errorf("%w: the Proto.Actor cluster's remote was not configured with roam's RemoteConfig (roam checks every frame and sets its limits there)", roamerr.ErrNotConfigured)
		}
		if pc.Remote == nil {
			return nil, fmt.Errorf("%w: start the Proto.Actor cluster member (StartMember) before roam", roamerr.ErrInvalidOperation)
		}
		if err := v.(*remoteHooks).checkHost(pc.Config.RemoteConfig); err != nil {
			return nil, err
		}
		return &Transport{system: system, remote: pc.Remote, pc: pc, hooks: v.(*remoteHooks)}, nil
	}
	if prev, ok := ownRemotes.Load(system); hasRemote(system) && !(ok && prev.(*Transport).stopped.Load()) {
		return nil, fmt.Errorf("%w: the actor system has a remote roam did not configure; without a Proto.Actor cluster roam starts the remote itself", roamerr.ErrNotConfigured)
	}
	rcfg, err := own()
	if err != nil {
		return nil, err
	}
	v, ok := guardedConfigs.Load(rcfg)
	if !ok {
		return nil, fmt.Errorf("%w: the remote configuration was not made by RemoteConfig", roamerr.ErrNotConfigured)
	}
	if err := v.(*remoteHooks).checkHost(rcfg); err != nil {
		return nil, err
	}
	r := remote.NewRemote(system, rcfg)
	if err := startRemote(r); err != nil {
		return nil, err
	}
	t := &Transport{system: system, remote: r, hooks: v.(*remoteHooks), ownsRemote: true}
	ownRemotes.Store(system, t)
	return t, nil
}

// ownRemotes are the remotes Attach started, by system: Proto.Actor keeps a
// stopped remote registered, and a Start that failed after the remote ran
// must be able to start one again.
var ownRemotes sync.Map // *actor.ActorSystem → *Transport

// System is the application's actor system.
func (t *Transport) System() *actor.ActorSystem { return t.system }

// Stop stops the remote if Attach started it; the actor system and a
// Proto.Actor cluster are the application's to stop.
func (t *Transport) Stop() { t.stop(false) }

// StopUnused stops the remote Attach started and nothing used yet (a Start
// that failed), fully, so that a later Attach can start one again on the
// same system.
func (t *Transport) StopUnused() { t.stop(true) }

func (t *Transport) stop(unused bool) {
	t.stopOnce.Do(func() {
		if t.ownsRemote {
			// Proto.Actor's graceful stop also stops the endpoint manager
			// (so a new remote can start on the system), but it races with
			// deliveries still in flight (it clears its connection map
			// under them): only a remote nobody used yet gets it.
			t.remote.Shutdown(unused)
			t.stopped.Store(unused)
		}
	})
}

// nopStream is the stream of an identity check made outside a gRPC
// stream (the chunk link's).
type nopStream struct{ grpc.ServerStream }

func (nopStream) Context() context.Context { return context.Background() }

// loopback reports whether host is reached only from this machine: a
// loopback IP, or a name that resolves to loopback IPs only. An empty
// host, or 0.0.0.0, listens on every interface.
func loopback(host string) bool {
	if host == "localhost" {
		return true
	}
	if ip := net.ParseIP(host); ip != nil {
		return ip.IsLoopback()
	}
	if host == "" {
		return false
	}
	ips, err := net.LookupIP(host)
	if err != nil || len(ips) == 0 {
		return false
	}
	for _, ip := range ips {
		if !ip.IsLoopback() {
			return false
		}
	}
	return true
}

package cluster

import (
	"context"
	"fmt"
	"strings"

	"github.com/asynkron/protoactor-go/remote"
	"github.com/rs/zerolog"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// remoteOptions completes the remote configuration built from the
// application's RemoteOptions with roam's own: the frame limits first, so
// the application's options — TLS credentials, say — add to them instead
// of dropping them (an option given later wins), and the server guards.
func remoteOptions(rcfg *remote.Config, log zerolog.Logger) {
	rcfg.ServerOptions = append([]grpc.ServerOption{
		grpc.MaxRecvMsgSize(MaxFrameBytes), grpc.MaxSendMsgSize(MaxFrameBytes),
		grpc.ChainUnaryInterceptor(guardUnary(log)), grpc.ChainStreamInterceptor(guardStream(log)),
	}, rcfg.ServerOptions...)
	rcfg.DialOptions = append([]grpc.DialOption{
		grpc.WithDefaultCallOptions(grpc.MaxCallSendMsgSize(MaxFrameBytes), grpc.MaxCallRecvMsgSize(MaxFrameBytes)),
	}, rcfg.DialOptions...)
	rcfg.CallOptions = append([]grpc.CallOption{grpc.MaxCallSendMsgSize(MaxFrameBytes), grpc.MaxCallRecvMsgSize(MaxFrameBytes)}, rcfg.CallOptions...)
}

// unimplemented are Proto.Actor remote RPCs whose server side panics
// ("implement me"): one call from anyone who can reach the port would end
// the process.
var unimplemented = []string{"/remote.Remoting/ListProcesses", "/remote.Remoting/GetProcessDiagnostics"}

// guardUnary refuses the unimplemented RPCs and turns a panicking handler
// into an Internal error for that call, logged, instead of the end of the
// process.
func guardUnary(log zerolog.Logger) grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (resp any, err error) {
		for _, m := range unimplemented {
			if info.FullMethod == m {
				return nil, status.Errorf(codes.Unimplemented, "%s is not served by roam nodes", m)
			}
		}
		defer func() {
			if r := recover(); r != nil {
				err = panicked(log, info.FullMethod, r)
			}
		}()
		return handler(ctx, req)
	}
}

// guardStream ends a stream whose handler panics (a malformed frame from
// a peer) with an Internal error, logged, instead of ending the process.
func guardStream(log zerolog.Logger) grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) (err error) {
		defer func() {
			if r := recover(); r != nil {
				err = panicked(log, info.FullMethod, r)
			}
		}()
		return handler(srv, ss)
	}
}

func panicked(log zerolog.Logger, method string, r any) error {
	log.Error().Str("event", "remote_call_panicked").Str("method", method).Str("panic", strings.TrimSpace(fmt.Sprint(r))).
		Msg("a remote call's handler panicked; the call ended, the node goes on")
	return status.Errorf(codes.Internal, "%s failed", method)
}

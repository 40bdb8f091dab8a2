package server

import (
	"context"
	"fmt"
	"log/slog"
	"strconv"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvselect/kvselect/httpadmin"
	"github.com/kvselect/kvselect/replicas/mesh"
	"github.com/kvselect/kvselect/selection"
)

// startMesh joins the replica mesh when --replica-sync-port is given:
// admissions, prefill completions, frees and session bindings (with
// affinity on) go out on a PUB socket and come in from every peer's
// (Dynamo's "Peer Planes"). A port that cannot be bound stops the server, as
// in Dynamo. peers is nil without a mesh; close ends it.
func startMesh(ctx context.Context, o *options, svc *selection.Service, affinity bool, reg prometheus.Registerer, log *slog.Logger) (peers httpadmin.PeerManager, close func(), err error) {
	if !o.set["replica-sync-port"] {
		return nil, func() {}, nil
	}
	keys := make([][]byte, 0, len(o.replicaSyncKeys))
	for _, path := range o.replicaSyncKeys {
		key, err := mesh.LoadKey(path)
		if err != nil {
			return nil, nil, &UsageError{fmt.Errorf("--replica-sync-key-file: %w", err)}
		}
		keys = append(keys, key)
	}
	var signKey []byte
	if len(keys) > 0 {
		signKey, keys = keys[0], keys[1:]
	}
	// Not stopped by the signal: frees made while in-flight requests drain
	// still reach the peers; close ends the mesh after that.
	m, err := mesh.Start(context.WithoutCancel(ctx), svc.Replica(), mesh.Options{
		Bind:         "tcp://*:" + strconv.FormatUint(o.replicaSyncPort, 10),
		Peers:        o.replicaSyncPeers,
		Affinity:     affinity,
		ResolvePeers: o.replicaSyncResolve,
		Logger:       log,
		Key:          signKey,
		Keys:         keys,
	})
	if err != nil {
		return nil, nil, err
	}
	reg.MustRegister(m)
	if signKey == nil {
		log.Warn("replica sync runs without --replica-sync-key-file: anyone who reaches the port can inject bookings and session bindings (docs/replicas.md)", "port", o.replicaSyncPort)
	} else {
		log.Info("replica sync messages authenticated (HMAC-SHA256)", "verify_keys", 1+len(keys))
	}
	return m, func() { _ = m.Close() }, nil
}

package kube

import (
	"slices"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	giev1 "sigs.k8s.io/gateway-api-inference-extension/api/v1"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"
)

// TestNGFExampleWiring checks what deploy/examples/ngf needs beyond what every
// set gets (TestManifestsWireThePicker, and TestManifestsServerSideDryRun
// against a real kube-apiserver with the Gateway API and InferencePool CRDs):
// the route hangs off a Gateway of NGF's class and reaches the pool, the pool
// names kvselect's ext_proc port, and the picker decides on the request-headers
// response, the only one NGF's shim reads. What is not checked: NGF's
// controller and NGINX (no NGF CRDs or controller run here, so nothing proves
// NGF accepts the Gateway or provisions NGINX); docs/gateways.md's suite
// (conformance/gateways) runs NGF's shim and NGINX configuration for that.
func TestNGFExampleWiring(t *testing.T) {
	i := slices.IndexFunc(sets(), func(s manifestSet) bool { return s.name == "kustomize-ngf" })
	objs := render(t, sets()[i])

	gws := find(objs, "Gateway")
	if len(gws) != 1 {
		t.Fatalf("%d Gateways, want 1", len(gws))
	}
	gw := into[gatewayv1.Gateway](t, gws[0])
	// nginx is the GatewayClass NGF's chart installs; another class would
	// hand the route to another implementation.
	if gw.Spec.GatewayClassName != "nginx" {
		t.Errorf("Gateway %s: class %q, want nginx", gw.Name, gw.Spec.GatewayClassName)
	}

	routes := find(objs, "HTTPRoute")
	if len(routes) != 1 {
		t.Fatalf("%d HTTPRoutes, want 1", len(routes))
	}
	rt := into[gatewayv1.HTTPRoute](t, routes[0])
	if !slices.ContainsFunc(rt.Spec.ParentRefs, func(p gatewayv1.ParentReference) bool { return string(p.Name) == gw.Name }) {
		t.Errorf("HTTPRoute %s: parents %+v do not include Gateway %s", rt.Name, rt.Spec.ParentRefs, gw.Name)
	}

	pools := find(objs, "InferencePool")
	if len(pools) != 1 {
		t.Fatalf("%d InferencePools, want 1", len(pools))
	}
	pool := into[giev1.InferencePool](t, pools[0])
	if pool.APIVersion != giev1.GroupVersion.String() {
		t.Errorf("InferencePool %s: %s, want %s", pool.Name, pool.APIVersion, giev1.GroupVersion)
	}
	backend := rt.Spec.Rules[0].BackendRefs[0]
	if string(backend.Name) != pool.Name || backend.Group == nil || string(*backend.Group) != giev1.GroupName {
		t.Errorf("HTTPRoute %s: backend %+v, want InferencePool %s of %s", rt.Name, backend.BackendObjectReference, pool.Name, giev1.GroupName)
	}

	var svc *corev1.Service
	for _, u := range find(objs, "Service") {
		if u.GetName() == string(pool.Spec.EndpointPickerRef.Name) {
			svc = into[corev1.Service](t, u)
		}
	}
	if svc == nil {
		t.Fatalf("endpointPickerRef %s: no such Service in the set", pool.Spec.EndpointPickerRef.Name)
	}
	var target string
	for _, p := range svc.Spec.Ports {
		if int32(p.Port) == int32(pool.Spec.EndpointPickerRef.Port.Number) {
			target = p.TargetPort.String()
		}
	}

	var picker *appsv1.Deployment
	for _, u := range find(objs, "Deployment") {
		if u.GetName() == "kvselect" {
			picker = into[appsv1.Deployment](t, u)
		}
	}
	if picker == nil {
		t.Fatal("no kvselect Deployment")
	}
	c := picker.Spec.Template.Spec.Containers[0]
	if !slices.ContainsFunc(c.Ports, func(p corev1.ContainerPort) bool { return p.Name == target && p.ContainerPort == 9002 }) ||
		flagValue(c.Args, "--extproc-port") != "9002" {
		t.Errorf("pool's picker port %d reaches container port %q, which is not kvselect's --extproc-port 9002 (ports %+v, args %q)",
			pool.Spec.EndpointPickerRef.Port.Number, target, c.Ports, c.Args)
	}
	// NGF's shim sends no protocol_config and reads the destination from the
	// request-headers response only: in a buffered assumed body mode kvselect
	// would answer on the body response instead, and NGINX answers 500.
	if m := flagValue(c.Args, "--extproc-assume-request-body-mode"); m != "" && m != "full_duplex_streamed" {
		t.Errorf("--extproc-assume-request-body-mode=%s: NGF's shim reads the destination from the headers response only", m)
	}
	// NGF never sends the response phase; "response" would free every
	// booking as soon as the shim closes the stream.
	if m := flagValue(c.Args, "--booking-end"); m == "response" {
		t.Errorf("--booking-end=%s: behind NGF the loads would count no request in flight", m)
	}
	if flagValue(c.Args, "--pool-name") != pool.Name {
		t.Errorf("--pool-name=%s, pool %s", flagValue(c.Args, "--pool-name"), pool.Name)
	}
}

package main

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"net/url"
	"path"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/pflag"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/phalanx-rt/phalanx/examples"
	"github.com/phalanx-rt/phalanx/job"
	"github.com/phalanx-rt/phalanx/metrics"
)

// find is the object of kind and name, nil if the set has none.
func find[T any](s *k8sSet, kind, name string) *T {
	for _, o := range s.objects {
		if o.kind == kind && o.name == name {
			return o.obj.(*T)
		}
	}
	return nil
}

// workload is a StatefulSet or a Deployment: pods from a template.
type workload struct {
	k8sObject
	replicas int
	selector *metav1.LabelSelector
	pod      *corev1.PodTemplateSpec
	sts      *appsv1.StatefulSet // nil for a Deployment
}

func (s *k8sSet) workloads() []workload {
	var ws []workload
	for _, o := range s.objects {
		switch v := o.obj.(type) {
		case *appsv1.StatefulSet:
			ws = append(ws, workload{o, replicasOf(v.Spec.Replicas), v.Spec.Selector, &v.Spec.Template, v})
		case *appsv1.Deployment:
			ws = append(ws, workload{o, replicasOf(v.Spec.Replicas), v.Spec.Selector, &v.Spec.Template, nil})
		}
	}
	return ws
}

func replicasOf(r *int32) int {
	if r == nil {
		return 1
	}
	return int(*r)
}

// podName is the name of the workload's pod of ordinal i (a Deployment's
// pods have a hash and a random suffix; these stand in for them).
func (w workload) podName(i int) string {
	if w.sts != nil {
		return fmt.Sprintf("%s-%d", w.name, i)
	}
	return fmt.Sprintf("%s-5d8f9c7b6-x%d", w.name, i)
}

// podIP stands in for the IP address of a workload's pod: one of its own
// per workload and ordinal.
func podIP(wi, i int) string { return fmt.Sprintf("10.244.%d.%d", wi+1, i+1) }

// selects reports whether sel selects the pods of w.
func selects(sel *metav1.LabelSelector, w workload) bool {
	ls, err := metav1.LabelSelectorAsSelector(sel)
	return err == nil && !ls.Empty() && ls.Matches(labels.Set(w.pod.Labels))
}

// selected are the workloads whose pods sel selects.
func (s *k8sSet) selected(sel *metav1.LabelSelector) []workload {
	var out []workload
	for _, w := range s.workloads() {
		if sel != nil && selects(sel, w) {
			out = append(out, w)
		}
	}
	return out
}

// k8sCommands are the phalanx commands the manifests run, with the flags
// that name a port the container must declare.
var k8sCommands = map[string]struct {
	portFlags []string // host:port or a number
	bindFlag  string   // the data plane's listen address, advertised with --advertise
}{
	"worker":      {portFlags: []string{"bind", "metrics"}, bindFlag: "bind"},
	"ps":          {portFlags: []string{"listen"}, bindFlag: "listen"},
	"coordinator": {},
	"etcd":        {portFlags: []string{"client-port", "peer-port"}},
}

// phalanxContainer is one replica's phalanx container with its command
// line parsed by the command's own flags.
type phalanxContainer struct {
	w       workload
	wi      int // the workload's index in the set, for its pod IPs
	ordinal int
	c       *corev1.Container
	command string // worker, ps, coordinator or etcd
	flags   *pflag.FlagSet
	env     map[string]string // the container's variables, as the pod would see them
	where   string
}

// flag is the value of a flag of the container's command line.
func (p phalanxContainer) flag(name string) string {
	if f := p.flags.Lookup(name); f != nil {
		return f.Value.String()
	}
	return ""
}

func (p phalanxContainer) set(name string) bool {
	f := p.flags.Lookup(name)
	return f != nil && f.Changed
}

func (p phalanxContainer) tls() bool {
	return p.set("tls-ca") || p.set("tls-cert") || p.set("tls-key")
}

// isPhalanx says whether c runs the phalanx binary (by its command, or by
// its image's name when it has none).
func isPhalanx(c *corev1.Container) bool {
	if len(c.Command) > 0 {
		return path.Base(c.Command[0]) == "phalanx"
	}
	repo, _, _ := strings.Cut(path.Base(c.Image), ":")
	return repo == "phalanx"
}

// varRef is a $(VAR) in a container's arguments.
var varRef = regexp.MustCompile(`\$\(([A-Za-z_][A-Za-z0-9_]*)\)`)

// k8sCheck holds the problems found in a set.
type k8sCheck struct {
	s        *k8sSet
	probe    *probeServer
	problems []string
	phalanx  []phalanxContainer
}

func (c *k8sCheck) errorf(format string, a ...any) {
	c.problems = append(c.problems, fmt.Sprintf(format, a...))
}

// checkK8s finds every problem of the set.
func checkK8s(s *k8sSet, probe *probeServer) []string {
	c := &k8sCheck{s: s, probe: probe}
	c.kustomizations()
	c.namespaceAndLabels()
	c.references()
	c.selectors()
	c.services()
	c.statefulSets()
	c.parse()
	c.ports()
	c.probes()
	c.tls()
	c.membership() // and etcd's
	c.checkpoints()
	c.disruptionBudgets()
	return c.problems
}

// kustomizations: each kustomization.yaml lists exactly the manifests of
// its directory, in the set's namespace; a directory without one holds
// examples (the Secrets), not applied.
func (c *k8sCheck) kustomizations() {
	if len(c.s.kustomizations) == 0 {
		c.errorf("no kustomization.yaml")
	}
	for dir, k := range c.s.kustomizations {
		if k.APIVersion != "kustomize.config.k8s.io/v1beta1" || k.Kind != "Kustomization" {
			c.errorf("%s/kustomization.yaml: apiVersion %q kind %q, want kustomize.config.k8s.io/v1beta1 Kustomization", dir, k.APIVersion, k.Kind)
		}
		files := c.s.yamlFiles[dir]
		for _, r := range k.Resources {
			if !slices.Contains(files, r) {
				c.errorf("%s/kustomization.yaml lists %s, which is not a manifest of that directory", dir, r)
			}
		}
		for _, f := range files {
			if !slices.Contains(k.Resources, f) {
				c.errorf("%s/%s is not in its directory's kustomization.yaml", dir, f)
			}
		}
	}
}

// namespaceAndLabels: one namespace, declared in the set, and every
// object and pod labelled app.kubernetes.io/name=phalanx with its
// component.
func (c *k8sCheck) namespaceAndLabels() {
	var nss []string
	for _, o := range c.s.objects {
		if o.kind == "Namespace" {
			nss = append(nss, o.name)
		}
	}
	if len(nss) != 1 {
		c.errorf("want one Namespace in the set, have %v", nss)
		return
	}
	ns := nss[0]
	for dir, k := range c.s.kustomizations {
		if k.Namespace != ns {
			c.errorf("%s/kustomization.yaml: namespace %q, the set's is %q", dir, k.Namespace, ns)
		}
	}
	checkLabels := func(where string, l map[string]string) {
		if l["app.kubernetes.io/name"] != "phalanx" || l["app.kubernetes.io/component"] == "" {
			c.errorf("%s: labels %v, want app.kubernetes.io/name=phalanx and an app.kubernetes.io/component", where, l)
		}
	}
	for _, o := range c.s.objects {
		if o.kind != "Namespace" && o.meta.Namespace != ns {
			c.errorf("%s: namespace %q, the set's is %q", o, o.meta.Namespace, ns)
		}
		checkLabels(o.String(), o.meta.Labels)
	}
	for _, w := range c.s.workloads() {
		checkLabels(w.String()+" pod template", w.pod.Labels)
		if w.pod.Labels["app.kubernetes.io/component"] != w.meta.Labels["app.kubernetes.io/component"] {
			c.errorf("%s: its pods' component %q is not its own %q", w, w.pod.Labels["app.kubernetes.io/component"], w.meta.Labels["app.kubernetes.io/component"])
		}
	}
}

// secretKeys are the keys of a Secret (data and stringData).
func secretKeys(sec *corev1.Secret) []string {
	var ks []string
	for k := range sec.Data {
		ks = append(ks, k)
	}
	for k := range sec.StringData {
		ks = append(ks, k)
	}
	return ks
}

// references: every ConfigMap, Secret, key and claim a pod names is in
// the set; every volume mount names a volume, and every volume is
// mounted.
func (c *k8sCheck) references() {
	for _, w := range c.s.workloads() {
		spec := &w.pod.Spec
		vols := map[string]bool{}
		for _, v := range spec.Volumes {
			vols[v.Name] = false
			switch {
			case v.Secret != nil:
				sec := find[corev1.Secret](c.s, "Secret", v.Secret.SecretName)
				if sec == nil {
					c.errorf("%s: volume %s mounts Secret %s, which is not in the set", w, v.Name, v.Secret.SecretName)
					continue
				}
				for _, it := range v.Secret.Items {
					if !slices.Contains(secretKeys(sec), it.Key) {
						c.errorf("%s: volume %s mounts key %s of Secret %s, which has none", w, v.Name, it.Key, sec.Name)
					}
				}
			case v.ConfigMap != nil:
				if find[corev1.ConfigMap](c.s, "ConfigMap", v.ConfigMap.Name) == nil {
					c.errorf("%s: volume %s mounts ConfigMap %s, which is not in the set", w, v.Name, v.ConfigMap.Name)
				}
			case v.PersistentVolumeClaim != nil:
				if find[corev1.PersistentVolumeClaim](c.s, "PersistentVolumeClaim", v.PersistentVolumeClaim.ClaimName) == nil {
					c.errorf("%s: volume %s claims %s, no PersistentVolumeClaim of the set", w, v.Name, v.PersistentVolumeClaim.ClaimName)
				}
			}
		}
		if w.sts != nil {
			for _, t := range w.sts.Spec.VolumeClaimTemplates {
				vols[t.Name] = false
			}
		}
		for _, ct := range slices.Concat(spec.InitContainers, spec.Containers) {
			for _, m := range ct.VolumeMounts {
				if _, ok := vols[m.Name]; !ok {
					c.errorf("%s container %s: mounts volume %s, which the pod does not declare", w, ct.Name, m.Name)
					continue
				}
				vols[m.Name] = true
			}
			for _, e := range ct.Env {
				if e.ValueFrom == nil {
					continue
				}
				if r := e.ValueFrom.ConfigMapKeyRef; r != nil && !ptrTrue(r.Optional) {
					cm := find[corev1.ConfigMap](c.s, "ConfigMap", r.Name)
					switch _, ok := cmValue(cm, r.Key); {
					case cm == nil:
						c.errorf("%s container %s: env %s reads ConfigMap %s, which is not in the set", w, ct.Name, e.Name, r.Name)
					case !ok:
						c.errorf("%s container %s: env %s reads key %s of ConfigMap %s, which has none", w, ct.Name, e.Name, r.Key, r.Name)
					}
				}
				if r := e.ValueFrom.SecretKeyRef; r != nil && !ptrTrue(r.Optional) {
					sec := find[corev1.Secret](c.s, "Secret", r.Name)
					switch {
					case sec == nil:
						c.errorf("%s container %s: env %s reads Secret %s, which is not in the set", w, ct.Name, e.Name, r.Name)
					case !slices.Contains(secretKeys(sec), r.Key):
						c.errorf("%s container %s: env %s reads key %s of Secret %s, which has none", w, ct.Name, e.Name, r.Key, r.Name)
					}
				}
			}
			for _, e := range ct.EnvFrom {
				if r := e.ConfigMapRef; r != nil && find[corev1.ConfigMap](c.s, "ConfigMap", r.Name) == nil {
					c.errorf("%s container %s: envFrom ConfigMap %s, which is not in the set", w, ct.Name, r.Name)
				}
				if r := e.SecretRef; r != nil && find[corev1.Secret](c.s, "Secret", r.Name) == nil {
					c.errorf("%s container %s: envFrom Secret %s, which is not in the set", w, ct.Name, r.Name)
				}
			}
		}
		for _, name := range slices.Sorted(maps.Keys(vols)) {
			if !vols[name] {
				c.errorf("%s: volume %s is mounted by no container", w, name)
			}
		}
	}
}

func ptrTrue(b *bool) bool { return b != nil && *b }

func cmValue(cm *corev1.ConfigMap, key string) (string, bool) {
	if cm == nil {
		return "", false
	}
	v, ok := cm.Data[key]
	return v, ok
}

// selectors: every workload's selector selects its own pods and no other
// workload's; every PodDisruptionBudget, and every affinity and spread
// constraint, selects the pods of one workload.
func (c *k8sCheck) selectors() {
	ws := c.s.workloads()
	for _, w := range ws {
		if !selects(w.selector, w) {
			c.errorf("%s: its selector %v does not select its pod template's labels %v", w, metav1.FormatLabelSelector(w.selector), w.pod.Labels)
		}
		for _, o := range c.s.selected(w.selector) {
			if o.name != w.name {
				c.errorf("%s: its selector also selects the pods of %s", w, o)
			}
		}
		own := func(what string, sel *metav1.LabelSelector) {
			if !selects(sel, w) {
				c.errorf("%s: %s selects %s, not the workload's own pods", w, what, metav1.FormatLabelSelector(sel))
			}
		}
		if a := w.pod.Spec.Affinity; a != nil && a.PodAntiAffinity != nil {
			for _, t := range a.PodAntiAffinity.PreferredDuringSchedulingIgnoredDuringExecution {
				own("its pod anti-affinity", t.PodAffinityTerm.LabelSelector)
			}
			for _, t := range a.PodAntiAffinity.RequiredDuringSchedulingIgnoredDuringExecution {
				own("its pod anti-affinity", t.LabelSelector)
			}
		}
		for _, t := range w.pod.Spec.TopologySpreadConstraints {
			own("its topology spread constraint", t.LabelSelector)
		}
	}
	for _, o := range c.s.objects {
		if pdb, ok := o.obj.(*policyv1.PodDisruptionBudget); ok {
			if n := len(c.s.selected(pdb.Spec.Selector)); n != 1 {
				c.errorf("%s: selects the pods of %d workloads, want one", o, n)
			}
		}
	}
}

// services: every Service selects the pods of one workload, and each of
// its ports targets a port the pods' containers declare.
func (c *k8sCheck) services() {
	for _, o := range c.s.objects {
		svc, ok := o.obj.(*corev1.Service)
		if !ok {
			continue
		}
		sel := &metav1.LabelSelector{MatchLabels: svc.Spec.Selector}
		ws := c.s.selected(sel)
		if len(ws) != 1 {
			c.errorf("%s: selector %v selects the pods of %d workloads, want one", o, svc.Spec.Selector, len(ws))
			continue
		}
		for _, p := range svc.Spec.Ports {
			target := p.TargetPort
			if target.Type == intstr.Int && target.IntVal == 0 {
				target = intstr.FromInt32(p.Port)
			}
			if containerPort(ws[0].pod, target) == nil {
				c.errorf("%s: port %s targets %s, which no container of %s declares", o, p.Name, target.String(), ws[0])
			}
		}
	}
}

// containerPort is the port of the pod's containers that target names
// (by name or number).
func containerPort(pod *corev1.PodTemplateSpec, target intstr.IntOrString) *corev1.ContainerPort {
	for i := range pod.Spec.Containers {
		for j, p := range pod.Spec.Containers[i].Ports {
			if target.Type == intstr.String && p.Name == target.StrVal || target.Type == intstr.Int && p.ContainerPort == target.IntVal {
				return &pod.Spec.Containers[i].Ports[j]
			}
		}
	}
	return nil
}

// statefulSets: each names a headless Service of the set that selects its
// pods, and starts its pods in parallel (etcd's members must all start
// for the first to be ready; a worker waits in etcd, not for its
// neighbours).
func (c *k8sCheck) statefulSets() {
	for _, w := range c.s.workloads() {
		if w.sts == nil {
			continue
		}
		svc := find[corev1.Service](c.s, "Service", w.sts.Spec.ServiceName)
		switch {
		case svc == nil:
			c.errorf("%s: serviceName %q names no Service of the set", w, w.sts.Spec.ServiceName)
		case svc.Spec.ClusterIP != corev1.ClusterIPNone:
			c.errorf("%s: serviceName %q names a Service that is not headless (clusterIP: None)", w, svc.Name)
		case !selects(&metav1.LabelSelector{MatchLabels: svc.Spec.Selector}, w):
			c.errorf("%s: its Service %s does not select its pods", w, svc.Name)
		}
		if w.sts.Spec.PodManagementPolicy != appsv1.ParallelPodManagement {
			c.errorf("%s: podManagementPolicy %q, want Parallel", w, w.sts.Spec.PodManagementPolicy)
		}
	}
}

// parse parses every phalanx container's command line, for every
// replica, with the command's own flags (the command tree's, persistent
// flags included), after Kubernetes' $(VAR) expansion from the
// container's environment as the pod would see it; PHALANX_* variables
// fill flags as the command's environment does.
func (c *k8sCheck) parse() {
	for wi, w := range c.s.workloads() {
		for ci := range w.pod.Spec.Containers {
			ct := &w.pod.Spec.Containers[ci]
			if !isPhalanx(ct) {
				continue
			}
			where := fmt.Sprintf("%s container %s", w, ct.Name)
			if !slices.Equal(ct.Command, []string{phalanxBinary}) {
				c.errorf("%s: command %q, want [%s] (where the Dockerfile puts it)", where, ct.Command, phalanxBinary)
			}
			if _, ok := k8sCommands[firstOr(ct.Args)]; !ok {
				c.errorf("%s: runs phalanx %q, not one of worker, ps, coordinator or etcd", where, ct.Args)
				continue
			}
			for i := 0; i < max(w.replicas, 1); i++ {
				p, ok := c.parseReplica(w, wi, i, ct, fmt.Sprintf("%s (pod %s)", where, w.podName(i)))
				if !ok {
					break // one replica's report is enough
				}
				c.phalanx = append(c.phalanx, p)
			}
		}
	}
}

func (c *k8sCheck) parseReplica(w workload, wi, i int, ct *corev1.Container, where string) (phalanxContainer, bool) {
	env, secretVars := map[string]string{}, map[string]bool{}
	for _, e := range ct.Env {
		switch {
		case e.ValueFrom == nil:
			env[e.Name] = e.Value
		case e.ValueFrom.FieldRef != nil:
			switch fp := e.ValueFrom.FieldRef.FieldPath; fp {
			case "metadata.name":
				env[e.Name] = w.podName(i)
			case "metadata.namespace":
				env[e.Name] = w.meta.Namespace
			case "status.podIP":
				env[e.Name] = podIP(wi, i)
			default:
				c.errorf("%s: env %s reads field %s, which the test does not know", where, e.Name, fp)
			}
		case e.ValueFrom.ConfigMapKeyRef != nil:
			env[e.Name], _ = cmValue(find[corev1.ConfigMap](c.s, "ConfigMap", e.ValueFrom.ConfigMapKeyRef.Name), e.ValueFrom.ConfigMapKeyRef.Key)
		case e.ValueFrom.SecretKeyRef != nil:
			env[e.Name], secretVars[e.Name] = "secret", true
		default:
			env[e.Name] = "1"
		}
		if e.Name == job.WorkerEnv {
			c.errorf("%s: env %s makes the process a launcher's worker (phalanx.Main takes it over)", where, e.Name)
		}
	}
	args := make([]string, len(ct.Args))
	for j, a := range ct.Args {
		args[j] = varRef.ReplaceAllStringFunc(a, func(ref string) string {
			name := varRef.FindStringSubmatch(ref)[1]
			v, ok := env[name]
			switch {
			case !ok:
				c.errorf("%s: argument %q names $(%s), no env var of the container (Kubernetes would pass it as is)", where, a, name)
			case secretVars[name]:
				c.errorf("%s: argument %q puts Secret-backed $(%s) on the command line, which every process of the host can read", where, a, name)
			}
			return v
		})
	}
	root := newRoot(examples.Registry(), io.Discard, io.Discard)
	cmd, rest, err := root.Find(args)
	if err != nil || cmd == root {
		c.errorf("%s: phalanx %s: no such command (%v)", where, args[0], err)
		return phalanxContainer{}, false
	}
	if err := cmd.ParseFlags(rest); err != nil {
		c.errorf("%s: %v", where, cmd.FlagErrorFunc()(cmd, err))
		return phalanxContainer{}, false
	}
	if err := cmd.ValidateArgs(cmd.Flags().Args()); err != nil {
		c.errorf("%s: phalanx %s: %v", where, args[0], err)
	}
	for _, e := range ct.Env {
		if !strings.HasPrefix(e.Name, "PHALANX_") || e.Name == job.WorkerEnv {
			continue
		}
		var f *pflag.Flag
		cmd.Flags().VisitAll(func(fl *pflag.Flag) {
			if envOf(fl.Name) == e.Name {
				f = fl
			}
		})
		switch {
		case f == nil:
			c.errorf("%s: env %s names no flag of phalanx %s (ignored)", where, e.Name, args[0])
		case secretVars[e.Name]:
		case !f.Changed:
			if err := cmd.Flags().Set(f.Name, env[e.Name]); err != nil {
				c.errorf("%s: env %s=%q: %v", where, e.Name, env[e.Name], err)
			}
		}
	}
	for _, name := range []string{"s3-access-key", "s3-secret-key"} {
		if f := cmd.Flags().Lookup(name); f != nil && f.Changed {
			c.errorf("%s: --%s on the command line, which every process of the host can read: give AWS_* env from a Secret", where, name)
		}
	}
	return phalanxContainer{w: w, wi: wi, ordinal: i, c: ct, command: args[0], flags: cmd.Flags(), env: env, where: where}, true
}

func firstOr(args []string) string {
	if len(args) == 0 {
		return ""
	}
	return args[0]
}

// portOf is the port of a host:port or a number.
func portOf(v string) (int32, error) {
	if _, p, err := net.SplitHostPort(v); err == nil {
		v = p
	}
	n, err := strconv.ParseInt(v, 10, 32)
	if err != nil || n <= 0 || n > 65535 {
		return 0, fmt.Errorf("%q is no fixed port", v)
	}
	return int32(n), nil
}

// ports: every port a command line names is a declared containerPort, and
// a data plane bound to every interface advertises the pod's own IP (or
// binds that IP).
func (c *k8sCheck) ports() {
	for _, p := range c.phalanx {
		for _, name := range k8sCommands[p.command].portFlags {
			port, err := portOf(p.flag(name))
			if err != nil {
				c.errorf("%s: --%s %s", p.where, name, err)
				continue
			}
			if cp := containerPort(&corev1.PodTemplateSpec{Spec: corev1.PodSpec{Containers: []corev1.Container{*p.c}}}, intstr.FromInt32(port)); cp == nil {
				c.errorf("%s: --%s %s: port %d is not a declared containerPort", p.where, name, p.flag(name), port)
			}
		}
		if b := k8sCommands[p.command].bindFlag; b != "" {
			host, _, err := net.SplitHostPort(p.flag(b))
			ip := podIP(p.wi, p.ordinal)
			switch {
			case err != nil:
				c.errorf("%s: --%s %q: %v", p.where, b, p.flag(b), err)
			case host == "0.0.0.0" || host == "::" || host == "":
				if p.flag("advertise") != ip {
					c.errorf("%s: --%s %s binds every interface: --advertise must be the pod's IP ($(POD_IP)), is %q", p.where, b, p.flag(b), p.flag("advertise"))
				}
			case host != ip:
				c.errorf("%s: --%s %s: other pods cannot reach that host; bind 0.0.0.0 and advertise $(POD_IP)", p.where, b, p.flag(b))
			}
		}
		if id := p.flags.Lookup("id"); id != nil && p.flag("id") != p.w.podName(p.ordinal) {
			c.errorf("%s: --id %q, want the pod's name ($(POD_NAME)): the replicas would share it", p.where, p.flag("id"))
		}
	}
}

// probeServer is a metrics server as every phalanx process serves it,
// whose readiness the test sets.
type probeServer struct {
	addr   string
	ready  atomic.Bool
	client *http.Client
}

func startProbeServer(t *testing.T) *probeServer {
	p := &probeServer{client: &http.Client{Timeout: 10 * time.Second}}
	srv, err := metrics.Serve("127.0.0.1:0", prometheus.NewRegistry(), func() string {
		if p.ready.Load() {
			return ""
		}
		return "waiting for the first generation"
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := srv.Close(ctx); err != nil {
			t.Error(err)
		}
	})
	p.addr = srv.Addr()
	return p
}

// status is what the server answers on path while ready (or not).
func (p *probeServer) status(path string, ready bool) (int, error) {
	p.ready.Store(ready)
	resp, err := p.client.Get("http://" + p.addr + path)
	if err != nil {
		return 0, err
	}
	resp.Body.Close()
	return resp.StatusCode, nil
}

// probes: a phalanx container serving --metrics has a readiness probe on
// the path that answers readiness, and liveness (and startup) probes on
// one that answers 200 while the process runs, ready or not, all on the
// --metrics port. Containers without --metrics have none: nothing there
// answers HTTP, and a TCP probe of a TLS port is a refused handshake in
// the logs every period.
func (c *k8sCheck) probes() {
	for _, p := range c.phalanx {
		if p.ordinal > 0 {
			continue // one template
		}
		probes := map[string]*corev1.Probe{"readiness": p.c.ReadinessProbe, "liveness": p.c.LivenessProbe, "startup": p.c.StartupProbe}
		if !p.set("metrics") {
			for kind, pr := range probes {
				if pr != nil {
					c.errorf("%s: a %s probe, and no --metrics to answer it", p.where, kind)
				}
			}
			continue
		}
		mport, err := portOf(p.flag("metrics"))
		if err != nil {
			continue // ports() says so
		}
		for _, kind := range []string{"readiness", "liveness", "startup"} {
			pr := probes[kind]
			if pr == nil {
				if kind != "startup" {
					c.errorf("%s: no %s probe on its --metrics port", p.where, kind)
				}
				continue
			}
			if pr.HTTPGet == nil {
				c.errorf("%s: the %s probe is not an HTTP GET of --metrics' /readyz or /healthz", p.where, kind)
				continue
			}
			if cp := containerPort(&corev1.PodTemplateSpec{Spec: corev1.PodSpec{Containers: []corev1.Container{*p.c}}}, pr.HTTPGet.Port); cp == nil || cp.ContainerPort != mport {
				c.errorf("%s: the %s probe's port %s is not the --metrics port %d", p.where, kind, pr.HTTPGet.Port.String(), mport)
			}
			waiting, err1 := c.probe.status(pr.HTTPGet.Path, false)
			ready, err2 := c.probe.status(pr.HTTPGet.Path, true)
			switch {
			case err1 != nil || err2 != nil:
				c.errorf("%s: the %s probe's path %s: %v", p.where, kind, pr.HTTPGet.Path, cmp.Or(err1, err2))
			case waiting == http.StatusNotFound || ready == http.StatusNotFound:
				c.errorf("%s: the %s probe's path %s is not served by the metrics server", p.where, kind, pr.HTTPGet.Path)
			case kind == "readiness" && (waiting != http.StatusServiceUnavailable || ready != http.StatusOK):
				c.errorf("%s: the readiness probe's path %s answers %d when not ready and %d when ready: it does not tell readiness", p.where, pr.HTTPGet.Path, waiting, ready)
			case kind != "readiness" && (waiting != http.StatusOK || ready != http.StatusOK):
				c.errorf("%s: the %s probe's path %s answers %d while the process waits for a ring: the kubelet would restart it", p.where, kind, pr.HTTPGet.Path, waiting)
			}
		}
	}
}

// secretFile is the Secret key behind file in p's pod, or why there is
// none.
func (c *k8sCheck) secretFile(p phalanxContainer, file string) error {
	for _, m := range p.c.VolumeMounts {
		rel, ok := strings.CutPrefix(path.Clean(file), path.Clean(m.MountPath)+"/")
		if m.SubPath != "" {
			rel, ok = m.SubPath, path.Clean(file) == path.Clean(m.MountPath)
		}
		if !ok {
			continue
		}
		for _, v := range p.w.pod.Spec.Volumes {
			if v.Name != m.Name {
				continue
			}
			if v.Secret == nil {
				return fmt.Errorf("volume %s is not a Secret", v.Name)
			}
			sec := find[corev1.Secret](c.s, "Secret", v.Secret.SecretName)
			if sec == nil {
				return fmt.Errorf("Secret %s is not in the set", v.Secret.SecretName)
			}
			key := rel
			if len(v.Secret.Items) > 0 {
				key = ""
				for _, it := range v.Secret.Items {
					if it.Path == rel {
						key = it.Key
					}
				}
			}
			if !slices.Contains(secretKeys(sec), key) {
				return fmt.Errorf("Secret %s (volume %s at %s) has no key %q", sec.Name, v.Name, m.MountPath, rel)
			}
			return nil
		}
	}
	return fmt.Errorf("no Secret volume is mounted there")
}

// tls: all three --tls-* flags or none, each naming a key of a Secret
// mounted where it points (for every replica: etcd members read their
// own pair); and TLS in every phalanx process or in none (a TLS process
// refuses plaintext, and the other way round).
func (c *k8sCheck) tls() {
	var with, without []string
	for _, p := range c.phalanx {
		if p.ordinal == 0 {
			if p.tls() {
				with = append(with, p.w.name)
			} else {
				without = append(without, p.w.name)
			}
		}
		if !p.tls() {
			continue
		}
		for _, name := range []string{"tls-ca", "tls-cert", "tls-key"} {
			if !p.set(name) {
				c.errorf("%s: TLS needs all three of --tls-ca, --tls-cert and --tls-key; --%s is missing", p.where, name)
				continue
			}
			if err := c.secretFile(p, p.flag(name)); err != nil {
				c.errorf("%s: --%s %s: %v", p.where, name, p.flag(name), err)
			}
		}
	}
	if len(with) > 0 && len(without) > 0 {
		c.errorf("TLS in %v and not in %v: a TLS process refuses plaintext peers", with, without)
	}
}

// etcdMembers are the etcd StatefulSet's members as clients and peers
// name them.
type etcdMembers struct {
	sts        workload
	headless   string
	clientPort string
	peerPort   string
	tls        bool
}

// memberHost reports whether host is the DNS name of member pod through
// the headless Service, in namespace ns.
func memberHost(host, pod, svc, ns string) bool {
	rest, ok := strings.CutPrefix(host, pod+"."+svc)
	return ok && (rest == "" || rest == "."+ns || rest == "."+ns+".svc" || strings.HasPrefix(rest, "."+ns+".svc.") && len(rest) > len(ns)+6)
}

// etcd: an odd number of members, each named after its pod, listening on
// its pod's IP, its data on its own volume, and --initial-cluster naming
// every member by its pod's DNS name through the headless Service.
func (c *k8sCheck) etcd() *etcdMembers {
	var e *etcdMembers
	for _, p := range c.phalanx {
		if p.command != "etcd" {
			continue
		}
		w := p.w
		if w.sts == nil {
			c.errorf("%s: etcd members must be a StatefulSet: stable names, each its own volume", w)
			return nil
		}
		if e == nil {
			e = &etcdMembers{sts: w, headless: w.sts.Spec.ServiceName, clientPort: p.flag("client-port"), peerPort: p.flag("peer-port"), tls: p.tls()}
			if w.replicas%2 == 0 {
				c.errorf("%s: %d etcd members: want an odd number (an even one tolerates no more failures than one fewer)", w, w.replicas)
			}
		}
		pod := w.podName(p.ordinal)
		if p.flag("name") != pod {
			c.errorf("%s: --name %q, want the pod's name ($(POD_NAME)), as --initial-cluster names it", p.where, p.flag("name"))
		}
		if p.flag("host") != podIP(p.wi, p.ordinal) {
			c.errorf("%s: --host %q, want the pod's IP ($(POD_IP)): etcd binds IP addresses only, and peers dial what it binds", p.where, p.flag("host"))
		}
		onClaim := false
		for _, m := range p.c.VolumeMounts {
			if w.sts != nil && slices.ContainsFunc(w.sts.Spec.VolumeClaimTemplates, func(t corev1.PersistentVolumeClaim) bool { return t.Name == m.Name }) &&
				strings.HasPrefix(path.Clean(p.flag("dir"))+"/", path.Clean(m.MountPath)+"/") {
				onClaim = true
			}
		}
		if !onClaim {
			c.errorf("%s: --dir %q is not on a volume of the StatefulSet's volumeClaimTemplates: a restarted member would lose its data", p.where, p.flag("dir"))
		}
		var want []string
		scheme := map[bool]string{false: "http", true: "https"}[p.tls()]
		for i := 0; i < w.replicas; i++ {
			want = append(want, w.podName(i))
		}
		entries := strings.Split(p.flag("initial-cluster"), ",")
		var names []string
		for _, ent := range entries {
			name, u, _ := strings.Cut(ent, "=")
			names = append(names, name)
			pu, err := url.Parse(u)
			switch {
			case err != nil:
				c.errorf("%s: --initial-cluster entry %q: %v", p.where, ent, err)
			case pu.Scheme != scheme:
				c.errorf("%s: --initial-cluster entry %q: want %s:// (TLS %v)", p.where, ent, scheme, p.tls())
			case !memberHost(pu.Hostname(), name, e.headless, w.meta.Namespace):
				c.errorf("%s: --initial-cluster entry %q: want the pod %s's DNS name through the headless Service %s", p.where, ent, name, e.headless)
			case pu.Port() != p.flag("peer-port"):
				c.errorf("%s: --initial-cluster entry %q: want the peer port %s", p.where, ent, p.flag("peer-port"))
			}
		}
		if !slices.Equal(names, want) {
			c.errorf("%s: --initial-cluster names %v, want each replica %v", p.where, names, want)
		}
	}
	if e != nil {
		if svc := find[corev1.Service](c.s, "Service", e.headless); svc != nil && !svc.Spec.PublishNotReadyAddresses {
			c.errorf("Service %s: publishNotReadyAddresses must be true: etcd members must resolve each other before any is ready", svc.Name)
		}
	}
	return e
}

// membership: every process names the same job and every etcd member,
// by DNS name through the headless Service, on its client port, over TLS
// if it speaks TLS; the coordinator's worker counts agree with the
// workers StatefulSet, and a standby coordinator exists.
func (c *k8sCheck) membership() {
	e := c.etcd()
	if e == nil {
		c.errorf("no etcd StatefulSet running phalanx etcd")
	}
	jobs := map[string]bool{}
	var workers *workload
	for _, p := range c.phalanx {
		if p.command == "worker" {
			w := p.w
			workers = &w
		}
	}
	for _, p := range c.phalanx {
		if p.command == "etcd" {
			continue
		}
		jobs[p.flag("job")] = true
		if p.flag("job") == "" {
			c.errorf("%s: no --job", p.where)
		}
		if e == nil {
			continue
		}
		eps := endpointList(p.flag("etcd-endpoints"))
		var named []string
		for _, ep := range eps {
			u, err := url.Parse(ep)
			if err != nil || u.Host == "" {
				c.errorf("%s: --etcd-endpoints %q: want scheme://host:port", p.where, ep)
				continue
			}
			if want := map[bool]string{false: "http", true: "https"}[p.tls()]; u.Scheme != want {
				c.errorf("%s: --etcd-endpoints %q: want %s:// (TLS %v)", p.where, ep, want, p.tls())
			}
			if p.tls() != e.tls {
				c.errorf("%s: TLS %v, and the etcd members' TLS is %v", p.where, p.tls(), e.tls)
			}
			member := ""
			for i := 0; i < e.sts.replicas; i++ {
				if memberHost(u.Hostname(), e.sts.podName(i), e.headless, e.sts.meta.Namespace) {
					member = e.sts.podName(i)
				}
			}
			switch {
			case member == "":
				c.errorf("%s: --etcd-endpoints %q names no etcd member's DNS name through the headless Service %s", p.where, ep, e.headless)
			case u.Port() != e.clientPort:
				c.errorf("%s: --etcd-endpoints %q: want the members' client port %s", p.where, ep, e.clientPort)
			}
			named = append(named, member)
		}
		for i := 0; i < e.sts.replicas; i++ {
			if !slices.Contains(named, e.sts.podName(i)) {
				c.errorf("%s: --etcd-endpoints leaves out the member %s: a client fails over only to the members it knows", p.where, e.sts.podName(i))
			}
		}
		if p.command == "coordinator" {
			lo, hi, n := flagInt(p, "min-workers"), flagInt(p, "max-workers"), flagInt(p, "workers")
			if lo < 1 || lo > hi {
				c.errorf("%s: --min-workers %d and --max-workers %d: want 1 <= min <= max", p.where, lo, hi)
			}
			if workers != nil && (n != workers.replicas || workers.replicas < lo || workers.replicas > hi) {
				c.errorf("%s: --workers %d (min %d, max %d), and %s has %d replicas: want --workers = replicas, within min and max", p.where, n, lo, hi, workers, workers.replicas)
			}
			if p.w.replicas < 2 {
				c.errorf("%s: %d replica: want 2 or more, a standby to take over", p.w, p.w.replicas)
			}
		}
	}
	if len(jobs) > 1 {
		c.errorf("the processes name different jobs (--job): %v", slices.Sorted(maps.Keys(jobs)))
	}
	if workers == nil {
		c.errorf("no workload runs phalanx worker")
	}
}

func flagInt(p phalanxContainer, name string) int {
	n, _ := strconv.Atoi(p.flag(name))
	return n
}

// checkpoints: an S3 store's endpoint, if in the cluster, is a Service of
// the set on a port it exposes; its credentials come from a Secret in
// the environment; and the pod's grace period outlasts --checkpoint-wait,
// the bound on the final checkpoint's upload after SIGTERM.
func (c *k8sCheck) checkpoints() {
	for _, p := range c.phalanx {
		if p.command != "worker" || p.ordinal > 0 {
			continue
		}
		loc := p.flag("checkpoint")
		if loc == "" {
			c.errorf("%s: no --checkpoint: a job on Kubernetes loses its pods", p.where)
			continue
		}
		wait, err := time.ParseDuration(p.flag("checkpoint-wait"))
		grace := time.Duration(ptrOr(p.w.pod.Spec.TerminationGracePeriodSeconds, 30)) * time.Second
		if err != nil || grace <= wait {
			c.errorf("%s: terminationGracePeriodSeconds %v, not longer than --checkpoint-wait %s: the kubelet would kill the final checkpoint's upload", p.where, grace, p.flag("checkpoint-wait"))
		}
		u, err := url.Parse(loc)
		if err != nil || u.Scheme != "s3" {
			c.errorf("%s: --checkpoint %q: want s3://bucket/prefix?endpoint=... (a pod's directory dies with it)", p.where, loc)
			continue
		}
		for _, v := range []string{"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"} {
			if !slices.ContainsFunc(p.c.Env, func(e corev1.EnvVar) bool {
				return e.Name == v && e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil
			}) {
				c.errorf("%s: --checkpoint on S3 and no %s from a Secret", p.where, v)
			}
		}
		host, port, err := net.SplitHostPort(u.Query().Get("endpoint"))
		if err != nil {
			c.errorf("%s: --checkpoint %q: endpoint=host:port: %v", p.where, loc, err)
			continue
		}
		parts := strings.Split(host, ".") // a Service's name: svc[.ns[.svc[.domain]]]
		if len(parts) > 2 && parts[2] != "svc" {
			continue // an external S3
		}
		svc := find[corev1.Service](c.s, "Service", parts[0])
		if svc == nil || len(parts) > 1 && parts[1] != svc.Namespace {
			c.errorf("%s: --checkpoint endpoint %s names no Service of the set", p.where, host)
			continue
		}
		if !slices.ContainsFunc(svc.Spec.Ports, func(sp corev1.ServicePort) bool { return strconv.Itoa(int(sp.Port)) == port }) {
			c.errorf("%s: --checkpoint endpoint %s:%s: Service %s exposes no port %s", p.where, host, port, svc.Name, port)
		}
	}
}

func ptrOr[T any](p *T, v T) T {
	if p == nil {
		return v
	}
	return *p
}

// disruptionBudgets: a drain never takes etcd below its quorum or the
// workers below the coordinator's --min-workers.
func (c *k8sCheck) disruptionBudgets() {
	minWorkers := 0
	for _, p := range c.phalanx {
		if p.command == "coordinator" {
			minWorkers = flagInt(p, "min-workers")
		}
	}
	covered := map[string]bool{}
	for _, o := range c.s.objects {
		pdb, ok := o.obj.(*policyv1.PodDisruptionBudget)
		if !ok {
			continue
		}
		for _, w := range c.s.selected(pdb.Spec.Selector) {
			covered[w.name] = true
			var kept int
			switch sp := pdb.Spec; {
			case sp.MaxUnavailable != nil && sp.MinAvailable == nil:
				n, err := intstr.GetScaledValueFromIntOrPercent(sp.MaxUnavailable, w.replicas, true)
				if err != nil {
					c.errorf("%s: maxUnavailable: %v", o, err)
				}
				kept = w.replicas - n
			case sp.MinAvailable != nil && sp.MaxUnavailable == nil:
				n, err := intstr.GetScaledValueFromIntOrPercent(sp.MinAvailable, w.replicas, true)
				if err != nil {
					c.errorf("%s: minAvailable: %v", o, err)
				}
				kept = n
			default:
				c.errorf("%s: want one of maxUnavailable and minAvailable", o)
				continue
			}
			if kept >= w.replicas {
				c.errorf("%s: keeps all %d pods of %s: a drain could never evict one", o, w.replicas, w)
			}
			for _, p := range c.phalanx {
				if p.w.name != w.name || p.ordinal > 0 {
					continue
				}
				switch {
				case p.command == "etcd" && kept < w.replicas/2+1:
					c.errorf("%s: keeps %d of %d etcd members, below the quorum of %d", o, kept, w.replicas, w.replicas/2+1)
				case p.command == "worker" && kept < minWorkers:
					c.errorf("%s: keeps %d of %d workers, below the coordinator's --min-workers %d", o, kept, w.replicas, minWorkers)
				}
			}
		}
	}
	for _, p := range c.phalanx {
		if (p.command == "etcd" || p.command == "worker") && !covered[p.w.name] {
			c.errorf("%s: no PodDisruptionBudget covers it", p.w)
			covered[p.w.name] = true
		}
	}
}

// A V8 heap larger than the budget: a Map of small objects and strings, grown (its pages
// committed, objects moved by the collector), read back at random and then all verified.
// Prints one line that must be the same natively and under farmem. Usage: node node_heap.js N
const n = Number(process.argv[2]);
const m = new Map();
for (let i = 0; i < n; i++) m.set('k' + i, { a: i, b: 'v'.repeat(20) + i, c: [i, i * 2, i * 3] });
let sum = 0;
for (let r = 0, x = 12345; r < n; r++) {
  x = (x * 1103515245 + 12345) % 2147483648;
  sum += m.get('k' + (x % n)).a;
}
for (let i = 0; i < n; i++) {
  const o = m.get('k' + i);
  if (o.a !== i || o.b !== 'v'.repeat(20) + i || o.c[2] !== i * 3) {
    console.log('lost data at', i);
    process.exit(1);
  }
}
console.log(n, 'entries verified, sum', sum);

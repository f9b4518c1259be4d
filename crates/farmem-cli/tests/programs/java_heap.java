// A Java heap larger than the budget: large arrays (G1's humongous regions) filled with a
// pattern, a map of small objects (young collections, objects moved), random reads, then
// every word verified. Prints one line that must be the same natively and under farmem.
// Run with the source launcher: java -Xmx1g java_heap.java MIB
public class JavaHeap {
    static long word(int i, int k) {
        return (long) i * 1_000_003L + k * 0x9E3779B97F4A7C15L;
    }

    public static void main(String[] args) {
        int n = Integer.parseInt(args[0]); // MiB of arrays
        long[][] blocks = new long[n][];
        for (int i = 0; i < n; i++) {
            long[] b = new long[131072];
            for (int k = 0; k < b.length; k++) b[k] = word(i, k);
            blocks[i] = b;
        }
        java.util.HashMap<Integer, String> m = new java.util.HashMap<>();
        for (int i = 0; i < 200_000; i++) m.put(i, "value-" + i);
        long sum = 0;
        java.util.Random r = new java.util.Random(1);
        for (int j = 0; j < 4 * n; j++) {
            long[] b = blocks[r.nextInt(n)];
            for (int k = 0; k < b.length; k += 512) sum += b[k];
            sum += m.get(r.nextInt(200_000)).length();
        }
        for (int i = 0; i < n; i++)
            for (int k = 0; k < blocks[i].length; k++)
                if (blocks[i][k] != word(i, k)) {
                    System.out.println("lost data at block " + i + " word " + k);
                    System.exit(1);
                }
        System.out.println(n + " MiB verified, sum " + sum + ", map " + m.size());
    }
}

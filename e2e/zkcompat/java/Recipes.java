public class Recipes { public static void main(String[] a) {} }
